// Read-only memory map of a whole file. The mapping lives as long as the last shared_ptr to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "util/status.h"

namespace kiln {

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  // Wraps bytes owned elsewhere (embedded model, fuzz input); `keepalive` may own them.
  static std::shared_ptr<MappedFile> from_memory(std::span<const uint8_t> bytes, std::string name,
                                                 std::shared_ptr<void> keepalive = nullptr);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  // Asks the kernel to read ahead (madvise WILLNEED); a hint only.
  void prefetch() const;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owns_mapping_ = false;
  std::string path_;
  std::shared_ptr<void> keepalive_;
};

}  // namespace kiln
