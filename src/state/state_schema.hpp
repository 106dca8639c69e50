// An algorithm's state, each section listed once: its name in the blob,
// where its bytes are and how long they are, how it is checked, whether it
// belongs to the rank that saved it, and the state view that shows it.
// Saving, checking (before anything changes), restoring, the section
// count, the state views (dsopt_get_state_view, dsopt_state_names) and the
// state's memory (dsopt_state_memory_usage) are generated from the list, in
// its order.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "state/blob.hpp"

namespace dsopt {

class Kernels;

class StateSchema {
 public:
  // The length of a section: of the live state (blob nullptr) or as blob r
  // recorded it (r checked up to this section).
  using Length = std::function<uint64_t(const BlobReader* r)>;

  // A float array in `kernels`' memory: saved from data(), restored into it
  // when `restore_if(r)` holds (default: always; a rank-local array passes
  // the test of the world size it was saved at; one it does not restore may
  // be saved empty).
  StateSchema& array(std::string name, Kernels& kernels, std::function<void*()> data,
                     Length bytes, std::function<bool(const BlobReader&)> restore_if = nullptr);
  // The same for an array whose length does not depend on the blob.
  StateSchema& array(std::string name, Kernels& kernels, std::function<void*()> data,
                     uint64_t bytes);
  // An array that blobs hold only where it has values: saved when its live
  // length is not 0; a blob without it reads as one whose length for it is
  // 0 (else the blob is corrupt).
  StateSchema& optional_array(std::string name, Kernels& kernels, std::function<void*()> data,
                              Length bytes, std::function<bool(const BlobReader&)> restore_if);

  // A record of host values, `bytes` long: `write` adds them, `check`
  // validates a saved one (throws Error(DSOPT_ECORRUPT) or
  // Error(DSOPT_EMISMATCH), may be null) and `read` restores it (may be
  // null when a later step reads it).
  using Write = std::function<void(FieldWriter&)>;
  using Read = std::function<void(FieldReader&)>;
  StateSchema& record(std::string name, uint64_t bytes, Write write, Read check, Read read);
  // The same for a record that blobs of an earlier layout lack: a blob
  // without it passes the check, and `absent` (may be null: nothing
  // changes) restores in its place.
  StateSchema& optional_record(std::string name, uint64_t bytes, Write write, Read check,
                               Read read, std::function<void()> absent);
  // The same for an optional record whose length depends on the blob
  // (`bytes` as for an array: a section laid out as an earlier layout was).
  StateSchema& optional_record(std::string name, Length bytes, Write write, Read check, Read read,
                               std::function<void()> absent);

  // A rule choice (algorithms/onebit/rule_flag.hpp): one int32 0 or 1; blobs without it
  // were written by the old rule (false). `what` names it in messages.
  StateSchema& flag(std::string name, const char* what, std::function<bool()> get,
                    std::function<void(bool)> set);
  // The choice blob r saved in flag `name` (false without the section);
  // throws Error(DSOPT_ECORRUPT) when it is neither 0 nor 1.
  static bool saved_flag(const BlobReader& r, const std::string& name, const char* what);

  // Parameter i's part of an array as a state view shows it: `numel` floats
  // at `data`, element `offset` of the parameter on; found false when the
  // array has no part for it.
  struct Slice {
    bool found = false;
    float* data = nullptr;
    int64_t numel = 0;
    int64_t offset = 0;
  };
  using Slicer = std::function<Slice(int64_t param, float* array)>;
  // Shows the last array as state view `name`; listed in the state names
  // while `listed()` holds (default: always). `slice` gets the array's
  // data, nullptr when it has none (a rank-local array not made yet).
  StateSchema& view(std::string name, Slicer slice, std::function<bool()> listed = nullptr);

  // A check of the blob as a whole at this point of the list (no section).
  StateSchema& check(std::function<void(const BlobReader&)> fn);
  // A restore step at this point of the list (no section): what depends on
  // the sections before it.
  StateSchema& then(std::function<void(const BlobReader&)> fn);

  // The view `name` of parameter `param` (found false: there is none), and
  // whether it lies in device memory.
  struct View {
    Slice slice;
    bool on_device = false;
  };
  View view(const std::string& name, int64_t param) const;
  // The listed views' names, space-separated.
  std::string view_names() const;

  // Bytes of the live arrays in host and in device memory: the state's
  // part of the optimizer's memory (dsopt_state_memory_usage).
  struct Bytes {
    uint64_t host = 0, device = 0;
  };
  Bytes array_bytes() const;

  uint32_t section_count() const;
  void save(BlobWriter& w) const;
  // Throws, changing nothing, unless the blob holds every section with its
  // length and valid values.
  void check(const BlobReader& r) const;
  // The records' value checks alone, of those the blob holds with their
  // length (throws, changes nothing): what is impossible in the blob,
  // found before check() compares it with the live state.
  void check_values(const BlobReader& r) const;
  void restore(const BlobReader& r) const;

 private:
  struct Entry {  // a section has save; a check or restore step has not
    std::function<void(BlobWriter&)> save;
    std::function<void(const BlobReader&)> check;
    std::function<void(const BlobReader&)> restore;
    std::function<void(const BlobReader&)> values;  // records only: check_values
    std::function<bool()> saved;  // whether save writes the section (null: always)
    // Arrays only.
    std::function<void*()> data;
    Kernels* kernels = nullptr;
    Length bytes;
    std::string view;
    Slicer slice;
    std::function<bool()> listed;
  };
  StateSchema& add_record(std::string name, Length bytes, Write write, Read check, Read read,
                          bool optional, std::function<void()> absent);
  std::vector<Entry> entries_;
};

}  // namespace dsopt
