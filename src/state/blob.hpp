// Versioned, checksummed, self-describing state blobs.
//
// Layout (little-endian):
//   "DSOPTST\0"  magic, 8 bytes
//   u32 format version, u32 reserved (0), u64 total size in bytes
//   str algorithm, u32 world size, u32 rank
//   u64 parameter count, then per parameter: i64 numel, i32 dtype, i32 group
//   u32 section count, then per section: str name, u64 byte length, bytes
//   u32 CRC-32 (zlib) of every byte before it
// A str is a u32 length followed by that many bytes.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dsopt {

class Kernels;

constexpr uint32_t kBlobFormatVersion = 1;

struct BlobParam {
  int64_t numel;
  int32_t dtype;
  int32_t group;
  bool operator==(const BlobParam& o) const {
    return numel == o.numel && dtype == o.dtype && group == o.group;
  }
};

struct BlobHeader {
  std::string algorithm;
  uint32_t world_size = 1;
  uint32_t rank = 0;
  std::vector<BlobParam> params;
};

// Writes a blob into dst, or only measures it when dst is null. Sections
// may come from device memory (copied by the optimizer's Kernels).
class BlobWriter {
 public:
  BlobWriter(void* dst, uint64_t capacity);
  void header(const BlobHeader& h);
  void begin_sections(uint32_t count);
  void section(const std::string& name, const void* host, uint64_t bytes);
  void section_from_device(const std::string& name, const void* src, uint64_t bytes,
                           Kernels& kernels);
  // Writes the checksum; returns the blob's size.
  uint64_t finish();
  uint64_t size() const { return pos_; }

 private:
  void put(const void* p, uint64_t n);
  void put_u32(uint32_t v) { put(&v, 4); }
  void put_u64(uint64_t v) { put(&v, 8); }
  void put_str(const std::string& s);
  uint8_t* dst_;
  uint64_t capacity_;
  uint64_t pos_ = 0;
};

// A parsed and checksum-verified blob; sections point into the caller's
// memory. Throws Error(DSOPT_ECORRUPT) on anything malformed. What the
// sections hold is the optimizers' to check.
class BlobReader {
 public:
  BlobReader(const void* src, uint64_t size);
  const BlobHeader& header() const { return header_; }
  bool has(const std::string& name) const { return sections_.count(name) != 0; }
  // Byte length of a section that exists (see has()).
  uint64_t section_size(const std::string& name) const { return sections_.at(name).size; }
  // The section's bytes; throws Error(DSOPT_ECORRUPT) if it is missing or
  // not exactly `bytes` long.
  const uint8_t* section(const std::string& name, uint64_t bytes) const;

 private:
  struct Span {
    const uint8_t* data;
    uint64_t size;
  };
  BlobHeader header_;
  std::map<std::string, Span> sections_;
};

// Helpers for small sections of plain values.
class FieldWriter {
 public:
  template <class T>
  FieldWriter& add(const T& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  FieldWriter& add_bytes(const std::vector<uint8_t>& bytes) {
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
    return *this;
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class FieldReader {
 public:
  FieldReader(const uint8_t* p, uint64_t n) : p_(p), n_(n) {}
  template <class T>
  T get();
  // The next `n` bytes (throws Error(DSOPT_ECORRUPT) past the end).
  const uint8_t* take(uint64_t n);
  // The bytes not read yet.
  uint64_t remaining() const { return n_ - pos_; }

 private:
  const uint8_t* p_;
  uint64_t n_;
  uint64_t pos_ = 0;
};

}  // namespace dsopt

#include "state/blob_fields.inl"
