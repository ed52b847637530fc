#include "util/mmap_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kiln {

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(ErrorCode::kIo, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(ErrorCode::kIo, "cannot stat '%s': %s", path.c_str(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(ErrorCode::kIo, "'%s' is not a regular file", path.c_str());
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return make_error(ErrorCode::kIo, "cannot mmap '%s' (%zu bytes): %s", path.c_str(), f->size_, std::strerror(e));
    }
    f->data_ = static_cast<const uint8_t*>(p);
    f->owns_mapping_ = true;
  }
  ::close(fd);
  return f;
}

std::shared_ptr<MappedFile> MappedFile::from_memory(std::span<const uint8_t> bytes, std::string name,
                                                    std::shared_ptr<void> keepalive) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->data_ = bytes.data();
  f->size_ = bytes.size();
  f->path_ = std::move(name);
  f->keepalive_ = std::move(keepalive);
  return f;
}

void MappedFile::prefetch() const {
  if (owns_mapping_ && size_ > 0) madvise(const_cast<uint8_t*>(data_), size_, MADV_WILLNEED);
}

MappedFile::~MappedFile() {
  if (owns_mapping_ && data_) munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace kiln
