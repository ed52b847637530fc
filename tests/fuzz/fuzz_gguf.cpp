// libFuzzer target: parse arbitrary bytes as GGUF and touch everything the parse returns (every value, every
// tensor's first and last data byte), so out-of-bounds pointers or sizes show up under ASan.
#include <cstddef>
#include <cstdint>

#include "gguf/gguf.h"

namespace {

size_t touch(const kiln::gguf::Value& v) {
  size_t h = static_cast<size_t>(v.type());
  if (v.is_string()) {
    for (char c : v.str()) h += static_cast<unsigned char>(c);
  } else if (v.is_array()) {
    for (const auto& x : v.arr().items) h += touch(x);
  } else {
    h += v.to_string().size();
  }
  return h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto map = kiln::MappedFile::from_memory({data, size}, "fuzz.gguf");
  auto f = kiln::gguf::File::parse(map);
  if (!f.is_ok()) return 0;
  volatile size_t sink = 0;
  for (const auto& kv : f->kvs()) {
    sink = sink + touch(kv.value) + kv.key.size();
    (void)f->get_u32(kv.key);
    (void)f->get_f32(kv.key);
    (void)f->get_str(kv.key);
    (void)f->get_str_array(kv.key);
    (void)f->get_i32_array(kv.key);
    (void)f->get_f32_array(kv.key);
  }
  for (const auto& t : f->tensors()) {
    sink = sink + t.n_elements() + t.shape_string().size();
    if (t.nbytes > 0) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    if (f->find_tensor(t.name) != &t) __builtin_trap();
  }
  return 0;
}
