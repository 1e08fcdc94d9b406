#include "nbd/negotiation.h"

#include <algorithm>

#include "nbd/transmission_codec.h"

namespace thindisk::nbd {

void MetaContexts::Add(const MetaContexts& other) {
  base_allocation |= other.base_allocation;
  allocation_depth |= other.allocation_depth;
  bitmaps.insert(bitmaps.end(), other.bitmaps.begin(), other.bitmaps.end());
  std::sort(bitmaps.begin(), bitmaps.end());
  bitmaps.erase(std::unique(bitmaps.begin(), bitmaps.end()), bitmaps.end());
}

namespace {

void Append(Bytes* out, const Bytes& more) {
  out->insert(out->end(), more.begin(), more.end());
}

// Which contexts of export `e` a query names. `namespace_ok` lets "base:",
// "qemu:" and "qemu:dirty-bitmap:" stand for every context they begin
// (NBD_OPT_LIST_META_CONTEXT).
MetaContexts Match(const std::string& query, bool namespace_ok, const Export& e) {
  MetaContexts m;
  m.base_allocation =
      query == kContextBaseAllocation || (namespace_ok && query == "base:");
  m.allocation_depth =
      query == kContextAllocationDepth || (namespace_ok && query == "qemu:");
  const bool all_bitmaps =
      namespace_ok && (query == "qemu:" || query == kContextDirtyBitmapPrefix);
  for (size_t i = 0; i < e.bitmaps.size(); ++i) {
    if (all_bitmaps || query == kContextDirtyBitmapPrefix + e.bitmaps[i]->name()) {
      m.bitmaps.push_back(i);
    }
  }
  return m;
}

}  // namespace

Negotiator::Negotiator(const std::vector<Export>* exports, ClientFlags client_flags,
                       const std::atomic<bool>* shutting_down, TlsPolicy tls)
    : exports_(exports),
      client_flags_(client_flags),
      shutting_down_(shutting_down),
      tls_(tls) {}

uint16_t Negotiator::transmission_flags() const {
  return TransmissionFlags(chosen_->effective_read_only(), structured_replies_);
}

const Export* Negotiator::Find(const std::string& name) const {
  for (const Export& e : *exports_)
    if (e.name == name) return &e;
  if (name.empty() && !exports_->empty()) return &exports_->front();
  return nullptr;
}

Negotiator::Step Negotiator::Handle(const Option& opt) {
  const uint32_t code = opt.code;
  if (code == kOptAbort) return {EncodeOptionReply(code, kRepAck), Next::kClose};
  if (++options_seen_ > MaxOptions()) {
    if (code == kOptExportName) return {{}, Next::kClose};  // it has no error reply
    return {EncodeOptionError(
                code, kRepErrPolicy,
                "too many options (limit " + std::to_string(MaxOptions()) + "); closing"),
            Next::kClose};
  }
  if (tls_.required && !tls_.active && code != kOptStartTls) {
    if (code == kOptExportName) return {{}, Next::kClose};  // it has no error reply
    return {EncodeOptionError(code, kRepErrTlsReqd,
                              "TLS is required: send NBD_OPT_STARTTLS first")};
  }
  if (code == kOptExportName) {
    // Cannot answer with an error: the spec says terminate the session.
    chosen_ = opt.payload_status.ok() ? Find(opt.export_name) : nullptr;
    if (!chosen_ || (shutting_down_ && shutting_down_->load())) return {{}, Next::kClose};
    if (contexts_for_ != chosen_) contexts_ = {};
    return {EncodeExportNameReply(chosen_->device->size(), transmission_flags(),
                                  client_flags_.no_zeroes),
            Next::kTransmission};
  }
  if (shutting_down_ && shutting_down_->load())
    return {EncodeOptionError(code, kRepErrShutdown, "server is shutting down")};
  if (!opt.payload_status.ok())
    return {EncodeOptionError(
        code, kRepErrInvalid,
        std::string(OptionName(code)) + ": " + opt.payload_status.message())};
  switch (code) {
    case kOptList:
      return HandleList(opt);
    case kOptStructuredReply:
      structured_replies_ = true;
      return {EncodeOptionReply(code, kRepAck)};
    case kOptInfo:
    case kOptGo:
      return HandleInfoOrGo(opt);
    case kOptListMetaContext:
    case kOptSetMetaContext:
      return HandleMetaContext(opt);
    case kOptStartTls:
      return HandleStartTls(opt);
    default:  // EXTENDED_HEADERS and unknown options
      return {EncodeOptionError(code, kRepErrUnsup,
                                "option " + std::to_string(code) + " is not supported")};
  }
}

Negotiator::Step Negotiator::HandleList(const Option& opt) {
  Bytes out;
  for (const Export& e : *exports_)
    Append(&out, EncodeRepServer(opt.code, e.name, e.description));
  Append(&out, EncodeOptionReply(opt.code, kRepAck));
  return {std::move(out)};
}

Negotiator::Step Negotiator::HandleStartTls(const Option& opt) {
  if (!tls_.offered)
    return {EncodeOptionError(opt.code, kRepErrUnsup, "TLS is not configured on this server")};
  if (tls_.active)
    return {EncodeOptionError(opt.code, kRepErrInvalid, "TLS is already active")};
  if (opt.length != 0)
    return {EncodeOptionError(opt.code, kRepErrInvalid, "NBD_OPT_STARTTLS takes no data")};
  return {EncodeOptionReply(opt.code, kRepAck), Next::kStartTls};
}

Negotiator::Step Negotiator::HandleInfoOrGo(const Option& opt) {
  const Export* e = Find(opt.export_name);
  if (!e)
    return {EncodeOptionError(opt.code, kRepErrUnknown,
                              "no export named '" + opt.export_name + "'")};
  const block::Device& dev = *e->device;
  const uint16_t flags = TransmissionFlags(e->effective_read_only(), structured_replies_);
  Bytes out = EncodeInfoExport(opt.code, dev.size(), flags);
  for (uint16_t request : opt.info_requests) {
    if (request == kInfoName) Append(&out, EncodeInfoName(opt.code, e->name));
    if (request == kInfoDescription && !e->description.empty())
      Append(&out, EncodeInfoDescription(opt.code, e->description));
  }
  uint32_t preferred = dev.info().preferred_block;
  if (preferred == 0 || preferred > kMaxPayloadLength || (preferred & (preferred - 1)))
    preferred = 4096;  // the spec requires a power of two within [min, max]
  Append(&out, EncodeInfoBlockSize(opt.code, 1, preferred, kMaxPayloadLength));
  Append(&out, EncodeOptionReply(opt.code, kRepAck));
  if (opt.code == kOptInfo) return {std::move(out)};
  chosen_ = e;
  if (contexts_for_ != e) contexts_ = {};
  return {std::move(out), Next::kTransmission};
}

Negotiator::Step Negotiator::HandleMetaContext(const Option& opt) {
  const bool set = opt.code == kOptSetMetaContext;
  if (!structured_replies_)
    return {EncodeOptionError(opt.code, kRepErrInvalid,
                              "negotiate structured replies first")};
  const Export* e = Find(opt.export_name);
  if (!e)
    return {EncodeOptionError(opt.code, kRepErrUnknown,
                              "no export named '" + opt.export_name + "'")};
  MetaContexts selected;
  if (!set && opt.queries.empty()) {
    selected.Add(Match("base:", true, *e));
    selected.Add(Match("qemu:", true, *e));
  }
  for (const std::string& q : opt.queries) selected.Add(Match(q, /*namespace_ok=*/!set, *e));
  Bytes out;
  if (selected.base_allocation)
    Append(&out, EncodeRepMetaContext(opt.code, set ? kBaseAllocationContextId : 0,
                                      kContextBaseAllocation));
  if (selected.allocation_depth)
    Append(&out, EncodeRepMetaContext(opt.code, set ? kAllocationDepthContextId : 0,
                                      kContextAllocationDepth));
  for (size_t i : selected.bitmaps) {
    Append(&out, EncodeRepMetaContext(opt.code, set ? kFirstBitmapContextId + uint32_t(i) : 0,
                                      kContextDirtyBitmapPrefix + e->bitmaps[i]->name()));
  }
  Append(&out, EncodeOptionReply(opt.code, kRepAck));
  if (set) {
    contexts_ = selected;  // SET replaces the previous selection
    contexts_for_ = e;
  }
  return {std::move(out)};
}

}  // namespace thindisk::nbd
