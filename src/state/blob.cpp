#include "state/blob.hpp"

#include <zlib.h>

#include <cstring>

#include "base/error.hpp"
#include "kernels/kernels.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "state blobs are little-endian");

namespace dsopt {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'O', 'P', 'T', 'S', 'T', '\0'};
constexpr uint64_t kPrefixBytes = 8 + 4 + 4 + 8;  // magic, version, reserved, total size
constexpr uint64_t kTrailerBytes = 4;

uint32_t crc_of(const uint8_t* p, uint64_t n) {
  return uint32_t(crc32_z(crc32_z(0L, Z_NULL, 0), p, size_t(n)));
}

// Sequential reads with bounds checks.
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t n) : p_(p), n_(n) {}
  const uint8_t* take(uint64_t k, const char* what) {
    if (k > n_ - pos_) fail(DSOPT_ECORRUPT, std::string("state blob is truncated (in ") + what + ")");
    const uint8_t* r = p_ + pos_;
    pos_ += k;
    return r;
  }
  template <class T>
  T get(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  std::string str(const char* what) {
    const uint32_t len = get<uint32_t>(what);
    const uint8_t* s = take(len, what);
    return std::string(reinterpret_cast<const char*>(s), len);
  }
  uint64_t pos() const { return pos_; }

 private:
  const uint8_t* p_;
  uint64_t n_;
  uint64_t pos_ = 0;
};

}  // namespace

BlobWriter::BlobWriter(void* dst, uint64_t capacity)
    : dst_(static_cast<uint8_t*>(dst)), capacity_(capacity) {
  put(kMagic, 8);
  put_u32(kBlobFormatVersion);
  put_u32(0);
  put_u64(0);  // total size, filled in by finish()
}

void BlobWriter::put(const void* p, uint64_t n) {
  if (dst_) {
    if (pos_ + n > capacity_) fail(DSOPT_EINTERNAL, "state blob larger than measured");
    std::memcpy(dst_ + pos_, p, n);
  }
  pos_ += n;
}

void BlobWriter::put_str(const std::string& s) {
  put_u32(uint32_t(s.size()));
  put(s.data(), s.size());
}

void BlobWriter::header(const BlobHeader& h) {
  put_str(h.algorithm);
  put_u32(h.world_size);
  put_u32(h.rank);
  put_u64(h.params.size());
  for (const BlobParam& p : h.params) {
    put(&p.numel, 8);
    put(&p.dtype, 4);
    put(&p.group, 4);
  }
}

void BlobWriter::begin_sections(uint32_t count) { put_u32(count); }

void BlobWriter::section(const std::string& name, const void* host, uint64_t bytes) {
  put_str(name);
  put_u64(bytes);
  put(host, bytes);
}

void BlobWriter::section_from_device(const std::string& name, const void* src, uint64_t bytes,
                                     Kernels& kernels) {
  put_str(name);
  put_u64(bytes);
  if (dst_ && bytes) {
    if (pos_ + bytes > capacity_) fail(DSOPT_EINTERNAL, "state blob larger than measured");
    kernels.copy_to_host(dst_ + pos_, src, bytes);
  }
  pos_ += bytes;
}

uint64_t BlobWriter::finish() {
  const uint64_t total = pos_ + kTrailerBytes;
  if (dst_) {
    std::memcpy(dst_ + 16, &total, 8);
    const uint32_t crc = crc_of(dst_, pos_);
    put_u32(crc);
  } else {
    pos_ += kTrailerBytes;
  }
  return total;
}

BlobReader::BlobReader(const void* src, uint64_t size) {
  const auto* p = static_cast<const uint8_t*>(src);
  if (size < kPrefixBytes + kTrailerBytes)
    fail(DSOPT_ECORRUPT, "state blob is truncated: " + std::to_string(size) + " bytes");
  if (std::memcmp(p, kMagic, 8) != 0) fail(DSOPT_ECORRUPT, "not a dsopt state blob (bad magic)");
  Cursor c(p, size);
  c.take(8, "magic");
  const uint32_t version = c.get<uint32_t>("version");
  if (version != kBlobFormatVersion)
    fail(DSOPT_ECORRUPT, "state blob format version " + std::to_string(version) +
                             " is not supported (this library reads version " +
                             std::to_string(kBlobFormatVersion) + ")");
  c.get<uint32_t>("reserved");
  const uint64_t total = c.get<uint64_t>("size");
  if (total != size)
    fail(DSOPT_ECORRUPT, "state blob is " + std::to_string(size) + " bytes but says it is " +
                             std::to_string(total) + " (truncated or padded)");
  uint32_t stored_crc;
  std::memcpy(&stored_crc, p + size - kTrailerBytes, 4);
  if (crc_of(p, size - kTrailerBytes) != stored_crc)
    fail(DSOPT_ECORRUPT, "state blob checksum mismatch (the blob is damaged)");

  Cursor body(p, size - kTrailerBytes);
  body.take(kPrefixBytes, "prefix");
  header_.algorithm = body.str("algorithm");
  header_.world_size = body.get<uint32_t>("world size");
  header_.rank = body.get<uint32_t>("rank");
  const uint64_t nparams = body.get<uint64_t>("parameter count");
  if (nparams > size / 16) fail(DSOPT_ECORRUPT, "state blob: implausible parameter count");
  header_.params.resize(size_t(nparams));
  for (BlobParam& bp : header_.params) {
    bp.numel = body.get<int64_t>("parameter shapes");
    bp.dtype = body.get<int32_t>("parameter shapes");
    bp.group = body.get<int32_t>("parameter shapes");
  }
  const uint32_t nsections = body.get<uint32_t>("section count");
  for (uint32_t i = 0; i < nsections; ++i) {
    std::string name = body.str("section name");
    const uint64_t bytes = body.get<uint64_t>("section length");
    const uint8_t* data = body.take(bytes, "section data");
    if (!sections_.emplace(name, Span{data, bytes}).second)
      fail(DSOPT_ECORRUPT, "state blob has section '" + name + "' twice");
  }
  if (body.pos() != size - kTrailerBytes)
    fail(DSOPT_ECORRUPT, "state blob has trailing bytes after its sections");
}

const uint8_t* BlobReader::section(const std::string& name, uint64_t bytes) const {
  auto it = sections_.find(name);
  if (it == sections_.end()) fail(DSOPT_ECORRUPT, "state blob lacks section '" + name + "'");
  if (it->second.size != bytes)
    fail(DSOPT_EMISMATCH, "state blob section '" + name + "' is " +
                              std::to_string(it->second.size) + " bytes, expected " +
                              std::to_string(bytes));
  return it->second.data;
}

}  // namespace dsopt
