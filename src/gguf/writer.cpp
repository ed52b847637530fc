// GGUF v3 writer.
//
// write(): the header (kvs + tensor infos) is serialized into memory; the data section is cut into work items of
// at most kWriteChunkBytes, each inside one tensor and aligned to its block bytes. Every thread of a pool takes
// items from an atomic counter, fills its own buffer (memcpy of borrowed data or the tensor's FillFn) and
// pwrites it at its final offset into a file pre-sized with ftruncate, so generation runs on all threads and the
// disk sees large writes. Padding between tensors is left to ftruncate's zeros.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>

#include "gguf/gguf.h"
#include "util/thread_pool.h"

namespace kiln::gguf {

namespace {

template <class T>
void put(std::string* out, T x) {
  out->append(reinterpret_cast<const char*>(&x), sizeof(T));
}

void put_string(std::string* out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

Status put_value(std::string* out, const Value& v, int depth, const std::string& key) {
  switch (v.type()) {
    case ValueType::U8: put(out, std::get<uint8_t>(v.v)); break;
    case ValueType::I8: put(out, std::get<int8_t>(v.v)); break;
    case ValueType::U16: put(out, std::get<uint16_t>(v.v)); break;
    case ValueType::I16: put(out, std::get<int16_t>(v.v)); break;
    case ValueType::U32: put(out, std::get<uint32_t>(v.v)); break;
    case ValueType::I32: put(out, std::get<int32_t>(v.v)); break;
    case ValueType::F32: put(out, std::get<float>(v.v)); break;
    case ValueType::U64: put(out, std::get<uint64_t>(v.v)); break;
    case ValueType::I64: put(out, std::get<int64_t>(v.v)); break;
    case ValueType::F64: put(out, std::get<double>(v.v)); break;
    case ValueType::BOOL: put<uint8_t>(out, std::get<bool>(v.v) ? 1 : 0); break;
    case ValueType::STRING: put_string(out, v.str()); break;
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        return make_error(ErrorCode::kInvalidArgument, "key '%s': arrays nested deeper than %d levels", key.c_str(),
                          kMaxArrayDepth);
      const Array& a = v.arr();
      put<uint32_t>(out, static_cast<uint32_t>(a.type));
      put<uint64_t>(out, a.items.size());
      for (size_t i = 0; i < a.items.size(); ++i) {
        if (a.items[i].type() != a.type)
          return make_error(ErrorCode::kInvalidArgument, "key '%s': array item %zu is %s in an array of %s",
                            key.c_str(), i, value_type_name(a.items[i].type()), value_type_name(a.type));
        KILN_TRY(put_value(out, a.items[i], depth + 1, key));
      }
      break;
    }
  }
  return Status::ok();
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

Status pwrite_all(int fd, const uint8_t* p, uint64_t n, uint64_t off, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::kIo, "writing '%s' at offset %" PRIu64 ": %s", path.c_str(), off,
                        std::strerror(errno));
    }
    p += w;
    n -= static_cast<uint64_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return Status::ok();
}

const char* file_kind(mode_t m) {
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// The file write() replaces: `path` with symlinks followed (a dangling link gives the path it points to, which
// write() creates). Anything that exists and is not a regular file is refused.
Result<std::string> resolve_target(const std::string& path) {
  std::string cur = path;
  for (int depth = 0; depth <= 40; ++depth) {
    struct stat st {};
    if (::lstat(cur.c_str(), &st) != 0) {
      if (errno == ENOENT) return cur;  // a new file
      return make_error(ErrorCode::kIo, "cannot write '%s': %s", cur.c_str(), std::strerror(errno));
    }
    if (!S_ISLNK(st.st_mode)) {
      if (!S_ISREG(st.st_mode))
        return make_error(ErrorCode::kInvalidArgument, "'%s'%s is %s, not a regular file: refusing to replace it",
                          cur.c_str(), cur == path ? "" : strprintf(" (the target of '%s')", path.c_str()).c_str(),
                          file_kind(st.st_mode));
      return cur;
    }
    std::string link(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(cur.c_str(), link.data(), link.size());
    if (n < 0) return make_error(ErrorCode::kIo, "cannot read the symlink '%s': %s", cur.c_str(), std::strerror(errno));
    if (static_cast<size_t>(n) >= link.size())
      return make_error(ErrorCode::kIo, "the symlink '%s' changed while being read", cur.c_str());
    link.resize(static_cast<size_t>(n));
    if (link.empty()) return make_error(ErrorCode::kIo, "the symlink '%s' is empty", cur.c_str());
    if (link[0] != '/') {
      const size_t slash = cur.rfind('/');
      if (slash != std::string::npos) link = cur.substr(0, slash + 1) + link;
    }
    cur = std::move(link);
  }
  return make_error(ErrorCode::kIo, "cannot write '%s': too many levels of symbolic links", path.c_str());
}

// Creates a new file next to `target` with a unique name (O_EXCL: never an existing file).
Result<int> create_temp(const std::string& target, std::string* tmp) {
  static std::atomic<uint64_t> counter{0};
  const uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (int attempt = 0; attempt < 64; ++attempt) {
    uint64_t x = seed + (counter.fetch_add(1) + 1) * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ull;
    *tmp = target + strprintf(".tmp.%d.%06" PRIx64, static_cast<int>(::getpid()), (x ^ (x >> 29)) & 0xffffff);
    const int fd = ::open(tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST)
      return make_error(ErrorCode::kIo, "cannot write '%s': creating its temporary file '%s': %s", target.c_str(),
                        tmp->c_str(), std::strerror(errno));
  }
  return make_error(ErrorCode::kIo, "cannot create a temporary file next to '%s': every name tried exists",
                    target.c_str());
}

}  // namespace

void Writer::set(std::string key, Value value) {
  if (key == "general.alignment" && value.type() == ValueType::U32) alignment_ = std::get<uint32_t>(value.v);
  for (KeyValue& kv : kvs_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  kvs_.push_back({std::move(key), std::move(value), 0});
}

const Value* Writer::find(std::string_view key) const {
  for (const KeyValue& kv : kvs_)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

bool Writer::remove(std::string_view key) {
  for (size_t i = 0; i < kvs_.size(); ++i) {
    if (kvs_[i].key == key) {
      if (key == "general.alignment") alignment_ = kDefaultAlignment;
      kvs_.erase(kvs_.begin() + static_cast<ptrdiff_t>(i));
      return true;
    }
  }
  return false;
}

void Writer::set_alignment(uint64_t alignment) {
  if (alignment == kDefaultAlignment) {
    remove("general.alignment");
    alignment_ = alignment;
    return;
  }
  // A value that is not a u32 power of two is kept and reported by write().
  set("general.alignment", static_cast<uint32_t>(alignment));
  alignment_ = alignment;
}

Status Writer::add_tensor(std::string name, DType type, std::vector<int64_t> ne, const void* data) {
  KILN_TRY(add_tensor(std::move(name), type, std::move(ne), FillFn()));
  if (!data && tensors_.back().nbytes > 0) {
    Status st = make_error(ErrorCode::kInvalidArgument, "tensor '%s': null data", tensors_.back().name.c_str());
    tensors_.pop_back();
    return st;
  }
  tensors_.back().data = data;
  return Status::ok();
}

Status Writer::add_tensor(std::string name, DType type, std::vector<int64_t> ne, FillFn fill) {
  if (!dtype_is_valid(static_cast<uint32_t>(type)))
    return make_error(ErrorCode::kInvalidArgument, "tensor '%s': invalid type id %u", name.c_str(),
                      static_cast<uint32_t>(type));
  if (ne.empty() || ne.size() > static_cast<size_t>(kMaxDims))
    return make_error(ErrorCode::kInvalidArgument, "tensor '%s': %zu dimensions (must be 1..%d)", name.c_str(),
                      ne.size(), kMaxDims);
  for (const PendingTensor& t : tensors_)
    if (t.name == name) return make_error(ErrorCode::kInvalidArgument, "duplicate tensor name '%s'", name.c_str());
  for (size_t d = 0; d < ne.size(); ++d)
    if (ne[d] < 0)
      return make_error(ErrorCode::kInvalidArgument, "tensor '%s': dimension %zu is negative", name.c_str(), d);
  Result<uint64_t> row = dtype_row_bytes(type, ne[0]);
  if (!row) return row.status().with_context("tensor '" + name + "'");
  uint64_t nbytes = *row;
  for (size_t d = 1; d < ne.size(); ++d)
    if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(ne[d]), &nbytes))
      return make_error(ErrorCode::kOutOfRange, "tensor '%s': byte size overflows 64 bits", name.c_str());
  tensors_.push_back({std::move(name), type, std::move(ne), nbytes, nullptr, std::move(fill)});
  return Status::ok();
}

Status Writer::build_header(std::string* out, std::vector<uint64_t>* offsets) const {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ > std::numeric_limits<uint32_t>::max())
    return make_error(ErrorCode::kInvalidArgument, "alignment %" PRIu64 " is not a u32 power of two", alignment_);
  out->clear();
  put<uint32_t>(out, kMagic);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kvs_.size());
  for (const KeyValue& kv : kvs_) {
    if (kv.key.empty())
      return make_error(ErrorCode::kInvalidArgument, "empty metadata key (GGUF keys must be non-empty)");
    put_string(out, kv.key);
    put<uint32_t>(out, static_cast<uint32_t>(kv.value.type()));
    KILN_TRY(put_value(out, kv.value, 0, kv.key));
  }
  offsets->assign(tensors_.size(), 0);
  uint64_t off = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) put<uint64_t>(out, static_cast<uint64_t>(n));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, off);
    (*offsets)[i] = off;
    off = align_up(off + t.nbytes, alignment_);
  }
  return Status::ok();
}

Result<uint64_t> Writer::file_size() const {
  std::string header;
  std::vector<uint64_t> offsets;
  KILN_TRY(build_header(&header, &offsets));
  uint64_t size = align_up(header.size(), alignment_);
  if (!tensors_.empty()) size += align_up(offsets.back() + tensors_.back().nbytes, alignment_);
  return size;
}

Status Writer::write(const std::string& path, int n_threads) const {
  std::string header;
  std::vector<uint64_t> offsets;
  KILN_TRY(build_header(&header, &offsets));
  const uint64_t data_offset = align_up(header.size(), alignment_);
  uint64_t total = data_offset;
  if (!tensors_.empty()) total += align_up(offsets.back() + tensors_.back().nbytes, alignment_);
  header.resize(data_offset, '\0');

  // Work items: [begin, begin+n) of tensor t, n a multiple of its block bytes.
  struct Item {
    size_t tensor;
    uint64_t begin, n;
  };
  std::vector<Item> items;
  uint64_t max_item = 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& t = tensors_[i];
    if (t.nbytes > 0 && !t.data && !t.fill)
      return make_error(ErrorCode::kInvalidArgument, "tensor '%s' has neither data nor a fill function",
                        t.name.c_str());
    const uint64_t block = static_cast<uint64_t>(dtype_type_size(t.type));
    const uint64_t step = std::max<uint64_t>(block, kWriteChunkBytes / block * block);
    for (uint64_t b = 0; b < t.nbytes; b += step) {
      items.push_back({i, b, std::min(step, t.nbytes - b)});
      max_item = std::max(max_item, items.back().n);
    }
  }

  KILN_ASSIGN_OR_RETURN(const std::string target, resolve_target(path));
  std::string tmp;
  KILN_ASSIGN_OR_RETURN(const int fd, create_temp(target, &tmp));
  auto fail_cleanup = [&](Status st) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  };
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0)
    return fail_cleanup(make_error(ErrorCode::kIo, "cannot size '%s' to %" PRIu64 " bytes: %s", tmp.c_str(), total,
                                   std::strerror(errno)));
  if (Status st = pwrite_all(fd, reinterpret_cast<const uint8_t*>(header.data()), header.size(), 0, tmp); !st)
    return fail_cleanup(st);

  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  Status err;
  auto work = [&](int, int) {
    std::unique_ptr<uint8_t[]> buf;
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t k = next.fetch_add(1);
      if (k >= items.size()) break;
      const Item& it = items[k];
      const PendingTensor& t = tensors_[it.tensor];
      const uint8_t* src;
      if (t.data) {
        src = static_cast<const uint8_t*>(t.data) + it.begin;  // borrowed: written straight from the caller's memory
      } else {
        if (!buf) buf.reset(new uint8_t[max_item]);
        t.fill(buf.get(), it.begin, it.n);
        src = buf.get();
      }
      Status st = pwrite_all(fd, src, it.n, data_offset + offsets[it.tensor] + it.begin, tmp);
      if (!st) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (err.is_ok()) err = st;
        failed.store(true);
      }
    }
  };
  if (n_threads == 1 || items.size() <= 1) {
    work(0, 1);
  } else {
    ThreadPool pool(n_threads);
    pool.run(work);
  }
  if (!err.is_ok()) return fail_cleanup(err);
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return make_error(ErrorCode::kIo, "closing '%s': %s", tmp.c_str(), std::strerror(errno));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return make_error(ErrorCode::kIo, "cannot rename '%s' to '%s': %s", tmp.c_str(), target.c_str(), std::strerror(e));
  }
  return Status::ok();
}

}  // namespace kiln::gguf
