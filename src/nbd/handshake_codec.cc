#include "nbd/handshake_codec.h"

#include <algorithm>

#include "util/endian.h"

namespace thindisk::nbd {
namespace {

// Reads big-endian fields from an option payload, never past its end.
class PayloadReader {
 public:
  explicit PayloadReader(std::span<const uint8_t> data) : data_(data) {}

  size_t remaining() const { return data_.size() - pos_; }

  bool U16(uint16_t* v) {
    if (remaining() < 2) return false;
    *v = LoadBe16(data_.data() + pos_);
    pos_ += 2;
    return true;
  }
  bool U32(uint32_t* v) {
    if (remaining() < 4) return false;
    *v = LoadBe32(data_.data() + pos_);
    pos_ += 4;
    return true;
  }
  // A string of `length` bytes: at most kMaxStringLength, no NUL (spec,
  // "Conventions").
  bool String(uint32_t length, std::string* out) {
    if (length > kMaxStringLength || remaining() < length) return false;
    const auto* begin = reinterpret_cast<const char*>(data_.data() + pos_);
    if (std::find(begin, begin + length, '\0') != begin + length) return false;
    out->assign(begin, length);
    pos_ += length;
    return true;
  }

 private:
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

// NBD_OPT_INFO / NBD_OPT_GO: u32 name length, name, u16 count, count x u16.
Status ParseInfoRequest(std::span<const uint8_t> data, Option* opt) {
  PayloadReader r(data);
  uint32_t name_length = 0;
  uint16_t count = 0;
  if (!r.U32(&name_length) || !r.String(name_length, &opt->export_name))
    return Status::InvalidArgument("export name length exceeds the option");
  if (!r.U16(&count)) return Status::InvalidArgument("missing information request count");
  if (r.remaining() != size_t{count} * 2)
    return Status::InvalidArgument(
        "information request count does not match the option length");
  for (uint16_t i = 0; i < count; ++i) {
    uint16_t type = 0;
    (void)r.U16(&type);  // length checked above
    opt->info_requests.push_back(type);
  }
  return Status::Ok();
}

// NBD_OPT_{LIST,SET}_META_CONTEXT: u32 name length, name, u32 count, then
// count x (u32 length, query).
Status ParseMetaContextRequest(std::span<const uint8_t> data, Option* opt) {
  PayloadReader r(data);
  uint32_t name_length = 0;
  uint32_t count = 0;
  if (!r.U32(&name_length) || !r.String(name_length, &opt->export_name))
    return Status::InvalidArgument("export name length exceeds the option");
  if (!r.U32(&count)) return Status::InvalidArgument("missing query count");
  // Each query takes at least its 4-byte length: bounds `count` before the
  // loop, so a hostile count cannot make us spin or reserve memory.
  if (count > r.remaining() / 4)
    return Status::InvalidArgument("query count exceeds the option length");
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t length = 0;
    std::string query;
    if (!r.U32(&length) || !r.String(length, &query))
      return Status::InvalidArgument("query length exceeds the option");
    opt->queries.push_back(std::move(query));
  }
  if (r.remaining() != 0)
    return Status::InvalidArgument("trailing bytes after the queries");
  return Status::Ok();
}

Status ParsePayload(std::span<const uint8_t> data, Option* opt) {
  switch (opt->code) {
    case kOptExportName: {
      PayloadReader r(data);
      if (!r.String(uint32_t(data.size()), &opt->export_name))
        return Status::InvalidArgument("export name too long or contains NUL");
      return Status::Ok();
    }
    case kOptInfo:
    case kOptGo:
      return ParseInfoRequest(data, opt);
    case kOptListMetaContext:
    case kOptSetMetaContext:
      return ParseMetaContextRequest(data, opt);
    case kOptList:
    case kOptStructuredReply:
      if (!data.empty()) return Status::InvalidArgument("option takes no data");
      return Status::Ok();
    default:  // ABORT ignores its data; unknown options are answered UNSUP
      return Status::Ok();
  }
}

void AppendBe16(Bytes* out, uint16_t v) {
  uint8_t b[2];
  StoreBe16(b, v);
  out->insert(out->end(), b, b + 2);
}
void AppendBe32(Bytes* out, uint32_t v) {
  uint8_t b[4];
  StoreBe32(b, v);
  out->insert(out->end(), b, b + 4);
}
void AppendBe64(Bytes* out, uint64_t v) {
  uint8_t b[8];
  StoreBe64(b, v);
  out->insert(out->end(), b, b + 8);
}
void AppendString(Bytes* out, std::string_view s) {
  s = s.substr(0, kMaxStringLength);
  out->insert(out->end(), s.begin(), s.end());
}

Bytes InfoReply(uint32_t option, uint16_t info_type, const Bytes& body) {
  Bytes data;
  AppendBe16(&data, info_type);
  data.insert(data.end(), body.begin(), body.end());
  return EncodeOptionReply(option, kRepInfo, data);
}

}  // namespace

Bytes EncodeGreeting() {
  Bytes out;
  AppendBe64(&out, kInitPasswd);
  AppendBe64(&out, kIHaveOpt);
  AppendBe16(&out, kFlagFixedNewstyle | kFlagNoZeroes);
  return out;
}

Result<Decoded<ClientFlags>> DecodeClientFlags(std::span<const uint8_t> in) {
  if (in.size() < kClientFlagsSize)
    return Decoded<ClientFlags>::NeedMore(kClientFlagsSize);
  uint32_t flags = LoadBe32(in.data());
  if (flags & ~(kFlagCFixedNewstyle | kFlagCNoZeroes))
    return Status::InvalidArgument("client set unknown handshake flags");
  ClientFlags cf;
  cf.fixed_newstyle = flags & kFlagCFixedNewstyle;
  cf.no_zeroes = flags & kFlagCNoZeroes;
  return Decoded<ClientFlags>::Done(cf, kClientFlagsSize);
}

Result<Decoded<Option>> DecodeOption(std::span<const uint8_t> in) {
  if (in.size() < kOptionHeaderSize) return Decoded<Option>::NeedMore(kOptionHeaderSize);
  if (LoadBe64(in.data()) != kIHaveOpt)
    return Status::Corrupt("option does not start with IHAVEOPT");
  Option opt;
  opt.code = LoadBe32(in.data() + 8);
  opt.length = LoadBe32(in.data() + 12);
  // Decided on the header alone, so the payload is never buffered.
  if (opt.length > kMaxOptionLength)
    return Status::OutOfRange("option data length " + std::to_string(opt.length) +
                              " exceeds the limit of " +
                              std::to_string(kMaxOptionLength));
  const size_t total = kOptionHeaderSize + opt.length;
  if (in.size() < total) return Decoded<Option>::NeedMore(total);
  opt.payload_status = ParsePayload(in.subspan(kOptionHeaderSize, opt.length), &opt);
  return Decoded<Option>::Done(std::move(opt), total);
}

Bytes EncodeOptionReply(uint32_t option, uint32_t type, std::span<const uint8_t> data) {
  Bytes out;
  out.reserve(kOptionReplyHeaderSize + data.size());
  AppendBe64(&out, kOptReplyMagic);
  AppendBe32(&out, option);
  AppendBe32(&out, type);
  AppendBe32(&out, uint32_t(data.size()));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Bytes EncodeOptionError(uint32_t option, uint32_t type, std::string_view message) {
  Bytes data;
  AppendString(&data, message);
  return EncodeOptionReply(option, type, data);
}

Bytes EncodeRepServer(uint32_t option, std::string_view name,
                      std::string_view description) {
  Bytes data;
  name = name.substr(0, kMaxStringLength);
  AppendBe32(&data, uint32_t(name.size()));
  AppendString(&data, name);
  AppendString(&data, description);
  return EncodeOptionReply(option, kRepServer, data);
}

Bytes EncodeRepMetaContext(uint32_t option, uint32_t context_id, std::string_view name) {
  Bytes data;
  AppendBe32(&data, context_id);
  AppendString(&data, name);
  return EncodeOptionReply(option, kRepMetaContext, data);
}

Bytes EncodeInfoExport(uint32_t option, uint64_t size, uint16_t transmission_flags) {
  Bytes body;
  AppendBe64(&body, size);
  AppendBe16(&body, transmission_flags);
  return InfoReply(option, kInfoExport, body);
}

Bytes EncodeInfoName(uint32_t option, std::string_view name) {
  Bytes body;
  AppendString(&body, name);
  return InfoReply(option, kInfoName, body);
}

Bytes EncodeInfoDescription(uint32_t option, std::string_view description) {
  Bytes body;
  AppendString(&body, description);
  return InfoReply(option, kInfoDescription, body);
}

Bytes EncodeInfoBlockSize(uint32_t option, uint32_t minimum, uint32_t preferred,
                          uint32_t maximum) {
  Bytes body;
  AppendBe32(&body, minimum);
  AppendBe32(&body, preferred);
  AppendBe32(&body, maximum);
  return InfoReply(option, kInfoBlockSize, body);
}

Bytes EncodeExportNameReply(uint64_t size, uint16_t transmission_flags, bool no_zeroes) {
  Bytes out;
  AppendBe64(&out, size);
  AppendBe16(&out, transmission_flags);
  if (!no_zeroes) out.resize(out.size() + kExportNameReplyZeroes, 0);
  return out;
}

std::string_view OptionName(uint32_t code) {
  switch (code) {
    case kOptExportName:
      return "NBD_OPT_EXPORT_NAME";
    case kOptAbort:
      return "NBD_OPT_ABORT";
    case kOptList:
      return "NBD_OPT_LIST";
    case kOptPeekExport:
      return "NBD_OPT_PEEK_EXPORT";
    case kOptStartTls:
      return "NBD_OPT_STARTTLS";
    case kOptInfo:
      return "NBD_OPT_INFO";
    case kOptGo:
      return "NBD_OPT_GO";
    case kOptStructuredReply:
      return "NBD_OPT_STRUCTURED_REPLY";
    case kOptListMetaContext:
      return "NBD_OPT_LIST_META_CONTEXT";
    case kOptSetMetaContext:
      return "NBD_OPT_SET_META_CONTEXT";
    case kOptExtendedHeaders:
      return "NBD_OPT_EXTENDED_HEADERS";
    default:
      return "unknown";
  }
}

}  // namespace thindisk::nbd
