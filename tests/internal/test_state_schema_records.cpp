// StateSchema's records (src/state/state_schema.hpp): a required record and
// an optional one saved, checked and restored; a blob without the optional
// record passes the check and restores its stand-in; a blob without the
// required one fails; check_values rejects an impossible value of a record
// the blob holds with its length and leaves out the others; an optional
// record whose length the blob chooses reads either layout it accepts.
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "dsopt.h"
#include "state/blob.hpp"
#include "state/state_schema.hpp"

using dsopt::BlobReader;
using dsopt::BlobWriter;
using dsopt::FieldReader;
using dsopt::FieldWriter;
using dsopt::StateSchema;

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL %s\n", what);
  }
}

struct Live {
  int64_t counter = 0;
  double rate = 0.0;
  bool rate_absent = false;  // the optional record's stand-in ran
};

// counter: required, >= 0; rate: optional, finite.
StateSchema schema(Live& live) {
  StateSchema s;
  s.record("t.counter", 8, [&live](FieldWriter& f) { f.add(live.counter); },
           [](FieldReader& f) {
             if (f.get<int64_t>() < 0) dsopt::fail(DSOPT_ECORRUPT, "negative counter");
           },
           [&live](FieldReader& f) { live.counter = f.get<int64_t>(); })
      .optional_record("t.rate", 8, [&live](FieldWriter& f) { f.add(live.rate); }, nullptr,
                       [&live](FieldReader& f) { live.rate = f.get<double>(); },
                       [&live] { live.rate_absent = true; });
  return s;
}

// A blob of the given sections (name, bytes), in order.
std::vector<uint8_t> blob(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& sections) {
  const auto write = [&](void* dst, uint64_t capacity) {
    BlobWriter w(dst, capacity);
    w.header(dsopt::BlobHeader{"Test", 1, 0, {}});
    w.begin_sections(uint32_t(sections.size()));
    for (const auto& s : sections) w.section(s.first, s.second.data(), s.second.size());
    return w.finish();
  };
  std::vector<uint8_t> out(write(nullptr, 0));
  write(out.data(), out.size());
  return out;
}

template <class T>
std::vector<uint8_t> bytes(T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  return std::vector<uint8_t>(p, p + sizeof v);
}

int status_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const dsopt::Error& e) {
    return e.status();
  }
  return DSOPT_OK;
}

void round_trip() {
  Live saved{7, 0.25, false};
  const StateSchema s = schema(saved);
  check(s.section_count() == 2, "two sections");
  const auto write = [&](void* dst, uint64_t capacity) {
    BlobWriter w(dst, capacity);
    w.header(dsopt::BlobHeader{"Test", 1, 0, {}});
    w.begin_sections(s.section_count());
    s.save(w);
    return w.finish();
  };
  std::vector<uint8_t> b(write(nullptr, 0));
  write(b.data(), b.size());
  const BlobReader r(b.data(), b.size());
  check(r.has("t.counter") && r.has("t.rate"), "both records saved");
  Live restored;
  const StateSchema t = schema(restored);
  check(status_of([&] { t.check(r); }) == DSOPT_OK, "a saved blob passes the check");
  t.restore(r);
  check(restored.counter == 7 && restored.rate == 0.25 && !restored.rate_absent, "restored");
}

void optional_record_absent() {
  const std::vector<uint8_t> b = blob({{"t.counter", bytes<int64_t>(3)}});
  const BlobReader r(b.data(), b.size());
  Live live{0, 0.5, false};
  const StateSchema s = schema(live);
  check(status_of([&] { s.check(r); }) == DSOPT_OK, "a blob without the optional record passes");
  s.restore(r);
  check(live.counter == 3 && live.rate == 0.5 && live.rate_absent,
        "the stand-in restores in the optional record's place");
}

void required_record_absent() {
  const std::vector<uint8_t> b = blob({{"t.rate", bytes<double>(1.0)}});
  const BlobReader r(b.data(), b.size());
  Live live;
  const StateSchema s = schema(live);
  check(status_of([&] { s.check(r); }) == DSOPT_ECORRUPT, "a blob without the required record fails");
}

void optional_record_wrong_length() {
  const std::vector<uint8_t> b = blob({{"t.counter", bytes<int64_t>(3)}, {"t.rate", bytes<int32_t>(1)}});
  const BlobReader r(b.data(), b.size());
  Live live;
  const StateSchema s = schema(live);
  check(status_of([&] { s.check(r); }) == DSOPT_EMISMATCH, "an optional record of another length fails");
}

void values() {
  Live live;
  const StateSchema s = schema(live);
  const std::vector<uint8_t> bad = blob({{"t.counter", bytes<int64_t>(-1)}});
  const BlobReader r(bad.data(), bad.size());
  check(status_of([&] { s.check_values(r); }) == DSOPT_ECORRUPT, "check_values finds a negative counter");
  check(status_of([&] { s.check(r); }) == DSOPT_ECORRUPT, "check finds it too");
  // Of another length, or absent: left to check().
  const std::vector<uint8_t> other = blob({{"t.counter", bytes<int32_t>(-1)}});
  const BlobReader o(other.data(), other.size());
  check(status_of([&] { s.check_values(o); }) == DSOPT_OK, "check_values leaves a record of another length");
  check(status_of([&] { s.check(o); }) == DSOPT_EMISMATCH, "check rejects its length");
  const std::vector<uint8_t> none = blob({});
  const BlobReader n(none.data(), none.size());
  check(status_of([&] { s.check_values(n); }) == DSOPT_OK, "check_values leaves an absent record");
}

// t.pair: two doubles, or one in a blob of the earlier layout (the second
// then keeps its value); each must be >= 0.
StateSchema pair_schema(double (&pair)[2]) {
  StateSchema s;
  const auto length = [&pair](const BlobReader* r) -> uint64_t {
    return r && r->has("t.pair") && r->section_size("t.pair") == 8 ? 8 : 16;
  };
  s.optional_record("t.pair", length, [&pair](FieldWriter& f) { f.add(pair[0]).add(pair[1]); },
                    [](FieldReader& f) {
                      while (f.remaining())
                        if (!(f.get<double>() >= 0)) dsopt::fail(DSOPT_ECORRUPT, "negative");
                    },
                    [&pair](FieldReader& f) {
                      for (int i = 0; f.remaining(); ++i) pair[i] = f.get<double>();
                    },
                    nullptr);
  return s;
}

struct Two {
  double a, b;
};

void record_of_blob_length() {
  double pair[2] = {1.0, 2.0};
  const StateSchema s = pair_schema(pair);
  const std::vector<uint8_t> now = blob({{"t.pair", bytes(Two{3.0, 4.0})}});
  const BlobReader r(now.data(), now.size());
  check(status_of([&] { s.check_values(r); s.check(r); }) == DSOPT_OK, "the live layout passes");
  s.restore(r);
  check(pair[0] == 3.0 && pair[1] == 4.0, "the live layout restored");
  const std::vector<uint8_t> earlier = blob({{"t.pair", bytes<double>(5.0)}});
  const BlobReader e(earlier.data(), earlier.size());
  check(status_of([&] { s.check_values(e); s.check(e); }) == DSOPT_OK, "the earlier layout passes");
  s.restore(e);
  check(pair[0] == 5.0 && pair[1] == 4.0, "the earlier layout restored, the rest kept");
  const std::vector<uint8_t> bad = blob({{"t.pair", bytes<double>(-5.0)}});
  const BlobReader b(bad.data(), bad.size());
  check(status_of([&] { s.check_values(b); }) == DSOPT_ECORRUPT, "check_values reads the earlier layout");
  const std::vector<uint8_t> odd = blob({{"t.pair", bytes<float>(1.0f)}});
  const BlobReader o(odd.data(), odd.size());
  check(status_of([&] { s.check_values(o); }) == DSOPT_OK, "check_values leaves a length of no layout");
  check(status_of([&] { s.check(o); }) == DSOPT_EMISMATCH, "check rejects it");
}

}  // namespace

int main() {
  round_trip();
  optional_record_absent();
  required_record_absent();
  optional_record_wrong_length();
  values();
  record_of_blob_length();
  std::printf("%s: %d failures\n", failures ? "FAIL" : "PASS", failures);
  return failures ? 1 : 0;
}
