#include "state/state_schema.hpp"

#include "base/error.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {

StateSchema& StateSchema::array(std::string name, Kernels& kernels, std::function<void*()> data,
                                Length bytes, std::function<bool(const BlobReader&)> restore_if) {
  const std::string n = name;
  Kernels* k = &kernels;
  entries_.push_back(Entry{
      std::move(name), bytes,
      [n, k, data, bytes](BlobWriter& w) { w.section_from_device(n, data(), bytes(nullptr), *k); },
      [n, bytes](const BlobReader& r) { r.section(n, bytes(&r)); },
      [n, k, data, bytes, restore_if](const BlobReader& r) {
        if (restore_if && !restore_if(r)) return;
        const uint64_t size = bytes(&r);
        if (size) k->copy_from_host(data(), r.section(n, size), size);
      }});
  return *this;
}

StateSchema& StateSchema::array(std::string name, Kernels& kernels, std::function<void*()> data,
                                uint64_t bytes) {
  return array(std::move(name), kernels, std::move(data), [bytes](const BlobReader*) { return bytes; });
}

StateSchema& StateSchema::record(std::string name, uint64_t bytes, Write write, Read check,
                                 Read read) {
  const std::string n = name;
  entries_.push_back(Entry{
      std::move(name), [bytes](const BlobReader*) { return bytes; },
      [n, write](BlobWriter& w) {
        FieldWriter f;
        write(f);
        w.section(n, f.bytes().data(), f.bytes().size());
      },
      [n, bytes, check](const BlobReader& r) {
        FieldReader f(r.section(n, bytes), bytes);
        if (check) check(f);
      },
      [n, bytes, read](const BlobReader& r) {
        if (!read) return;
        FieldReader f(r.section(n, bytes), bytes);
        read(f);
      }});
  return *this;
}

namespace {
// The saved choice (false when the blob has no such section).
bool saved_flag(const BlobReader& r, const std::string& name, const char* what) {
  if (!r.has(name)) return false;
  FieldReader f(r.section(name, 4), 4);
  const int32_t flag = f.get<int32_t>();
  if (flag != 0 && flag != 1) fail(DSOPT_ECORRUPT, std::string("state blob: invalid ") + what + " in " + name);
  return flag == 1;
}
}  // namespace

StateSchema& StateSchema::flag(std::string name, const char* what, std::function<bool()> get,
                               std::function<void(bool)> set) {
  const std::string n = name;
  entries_.push_back(Entry{
      std::move(name), [](const BlobReader*) { return uint64_t(4); },
      [n, get](BlobWriter& w) {
        const int32_t flag = get() ? 1 : 0;
        w.section(n, &flag, 4);
      },
      [n, what](const BlobReader& r) { saved_flag(r, n, what); },
      [n, what, set](const BlobReader& r) { set(saved_flag(r, n, what)); }});
  return *this;
}

StateSchema& StateSchema::check(std::function<void(const BlobReader&)> fn) {
  entries_.push_back(Entry{"", nullptr, nullptr, std::move(fn), nullptr});
  return *this;
}

StateSchema& StateSchema::then(std::function<void(const BlobReader&)> fn) {
  entries_.push_back(Entry{"", nullptr, nullptr, nullptr, std::move(fn)});
  return *this;
}

uint32_t StateSchema::section_count() const {
  uint32_t n = 0;
  for (const Entry& e : entries_) n += e.save ? 1 : 0;
  return n;
}

void StateSchema::save(BlobWriter& w) const {
  for (const Entry& e : entries_)
    if (e.save) e.save(w);
}

void StateSchema::check(const BlobReader& r) const {
  for (const Entry& e : entries_)
    if (e.check) e.check(r);
}

void StateSchema::restore(const BlobReader& r) const {
  for (const Entry& e : entries_)
    if (e.restore) e.restore(r);
}

}  // namespace dsopt
