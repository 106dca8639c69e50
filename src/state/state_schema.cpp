#include "state/state_schema.hpp"

#include "base/error.hpp"
#include "kernels/kernels.hpp"

namespace dsopt {

StateSchema& StateSchema::array(std::string name, Kernels& kernels, std::function<void*()> data,
                                Length bytes, std::function<bool(const BlobReader&)> restore_if) {
  const std::string n = name;
  Kernels* k = &kernels;
  Entry e;
  e.save = [n, k, data, bytes](BlobWriter& w) { w.section_from_device(n, data(), bytes(nullptr), *k); };
  e.check = [n, bytes, restore_if](const BlobReader& r) {
    // A rank-local array this load does not restore may be saved empty
    // (DSOPT_LOAD_WITHOUT_RANK_LOCAL).
    if (restore_if && r.has(n) && r.section_size(n) == 0 && !restore_if(r)) return;
    r.section(n, bytes(&r));
  };
  e.restore = [n, k, data, bytes, restore_if](const BlobReader& r) {
    if (restore_if && !restore_if(r)) return;
    const uint64_t size = bytes(&r);
    if (size) k->copy_from_host(data(), r.section(n, size), size);
  };
  e.data = std::move(data);
  e.kernels = k;
  e.bytes = std::move(bytes);
  entries_.push_back(std::move(e));
  return *this;
}

StateSchema& StateSchema::array(std::string name, Kernels& kernels, std::function<void*()> data,
                                uint64_t bytes) {
  return array(std::move(name), kernels, std::move(data), [bytes](const BlobReader*) { return bytes; });
}

StateSchema& StateSchema::optional_array(std::string name, Kernels& kernels,
                                         std::function<void*()> data, Length bytes,
                                         std::function<bool(const BlobReader&)> restore_if) {
  const std::string n = name;
  array(std::move(name), kernels, std::move(data), bytes, restore_if);
  Entry& e = entries_.back();
  e.saved = [bytes] { return bytes(nullptr) > 0; };
  e.check = [n, bytes, check = std::move(e.check)](const BlobReader& r) {
    if (!r.has(n)) {
      if (bytes(&r) > 0) fail(DSOPT_ECORRUPT, "state blob: section " + n + " is missing");
      return;
    }
    check(r);
  };
  e.restore = [n, restore = std::move(e.restore)](const BlobReader& r) {
    if (r.has(n)) restore(r);
  };
  return *this;
}

StateSchema& StateSchema::record(std::string name, uint64_t bytes, Write write, Read check,
                                 Read read) {
  return add_record(std::move(name), [bytes](const BlobReader*) { return bytes; }, std::move(write),
                    std::move(check), std::move(read), false, nullptr);
}

StateSchema& StateSchema::optional_record(std::string name, uint64_t bytes, Write write,
                                          Read check, Read read, std::function<void()> absent) {
  return optional_record(std::move(name), [bytes](const BlobReader*) { return bytes; },
                         std::move(write), std::move(check), std::move(read), std::move(absent));
}

StateSchema& StateSchema::optional_record(std::string name, Length bytes, Write write, Read check,
                                          Read read, std::function<void()> absent) {
  return add_record(std::move(name), std::move(bytes), std::move(write), std::move(check),
                    std::move(read), true, std::move(absent));
}

StateSchema& StateSchema::add_record(std::string name, Length bytes, Write write, Read check,
                                     Read read, bool optional, std::function<void()> absent) {
  const std::string n = name;
  Entry e;
  e.save = [n, write](BlobWriter& w) {
    FieldWriter f;
    write(f);
    w.section(n, f.bytes().data(), f.bytes().size());
  };
  e.check = [n, bytes, check, optional](const BlobReader& r) {
    if (optional && !r.has(n)) return;
    const uint64_t size = bytes(&r);
    FieldReader f(r.section(n, size), size);
    if (check) check(f);
  };
  e.values = [n, bytes, check](const BlobReader& r) {
    if (!check || !r.has(n)) return;
    const uint64_t size = bytes(&r);
    if (r.section_size(n) != size) return;
    FieldReader f(r.section(n, size), size);
    check(f);
  };
  e.restore = [n, bytes, read, optional, absent](const BlobReader& r) {
    if (optional && !r.has(n)) {
      if (absent) absent();
      return;
    }
    if (!read) return;
    const uint64_t size = bytes(&r);
    FieldReader f(r.section(n, size), size);
    read(f);
  };
  entries_.push_back(std::move(e));
  return *this;
}

bool StateSchema::saved_flag(const BlobReader& r, const std::string& name, const char* what) {
  if (!r.has(name)) return false;
  FieldReader f(r.section(name, 4), 4);
  const int32_t flag = f.get<int32_t>();
  if (flag != 0 && flag != 1) fail(DSOPT_ECORRUPT, std::string("state blob: invalid ") + what + " in " + name);
  return flag == 1;
}

StateSchema& StateSchema::flag(std::string name, const char* what, std::function<bool()> get,
                               std::function<void(bool)> set) {
  const std::string n = name;
  Entry e;
  e.save = [n, get](BlobWriter& w) {
    const int32_t flag = get() ? 1 : 0;
    w.section(n, &flag, 4);
  };
  e.check = [n, what](const BlobReader& r) { saved_flag(r, n, what); };
  e.restore = [n, what, set](const BlobReader& r) { set(saved_flag(r, n, what)); };
  entries_.push_back(std::move(e));
  return *this;
}

StateSchema& StateSchema::check(std::function<void(const BlobReader&)> fn) {
  Entry e;
  e.check = std::move(fn);
  entries_.push_back(std::move(e));
  return *this;
}

StateSchema& StateSchema::then(std::function<void(const BlobReader&)> fn) {
  Entry e;
  e.restore = std::move(fn);
  entries_.push_back(std::move(e));
  return *this;
}

StateSchema& StateSchema::view(std::string name, Slicer slice, std::function<bool()> listed) {
  if (entries_.empty() || !entries_.back().data)
    fail(DSOPT_EINTERNAL, "state schema: view " + name + " follows no array");
  Entry& e = entries_.back();
  e.view = std::move(name);
  e.slice = std::move(slice);
  e.listed = std::move(listed);
  return *this;
}

StateSchema::View StateSchema::view(const std::string& name, int64_t param) const {
  for (const Entry& e : entries_) {
    if (e.view != name || name.empty()) continue;
    View v;
    v.on_device = e.kernels->device() == Device::Cuda;
    v.slice = e.slice(param, static_cast<float*>(e.data()));
    return v;
  }
  return {};
}

std::string StateSchema::view_names() const {
  std::string names;
  for (const Entry& e : entries_)
    if (!e.view.empty() && (!e.listed || e.listed())) names += (names.empty() ? "" : " ") + e.view;
  return names;
}

uint32_t StateSchema::section_count() const {
  uint32_t n = 0;
  for (const Entry& e : entries_) n += e.save && (!e.saved || e.saved()) ? 1 : 0;
  return n;
}

void StateSchema::save(BlobWriter& w) const {
  for (const Entry& e : entries_)
    if (e.save && (!e.saved || e.saved())) e.save(w);
}

void StateSchema::check(const BlobReader& r) const {
  for (const Entry& e : entries_)
    if (e.check) e.check(r);
}

void StateSchema::check_values(const BlobReader& r) const {
  for (const Entry& e : entries_)
    if (e.values) e.values(r);
}

void StateSchema::restore(const BlobReader& r) const {
  for (const Entry& e : entries_)
    if (e.restore) e.restore(r);
}

StateSchema::Bytes StateSchema::array_bytes() const {
  Bytes b;
  for (const Entry& e : entries_) {
    if (!e.kernels || !e.data()) continue;  // not an array, or not made yet
    (e.kernels->device() == Device::Cuda ? b.device : b.host) += e.bytes(nullptr);
  }
  return b;
}

}  // namespace dsopt
