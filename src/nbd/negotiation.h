// Negotiator: the server's side of fixed-newstyle option haggling, as a
// state machine over decoded options. No sockets: it is handed an Option
// (handshake_codec.h) and answers with the bytes to send and what happens
// next, so every option path is unit-testable.
//
// Policy:
//  - NBD_OPT_EXPORT_NAME / NBD_OPT_GO pick an export; "" picks the export
//    named "" or, failing that, the first export. An unknown name fails GO
//    and INFO with NBD_REP_ERR_UNKNOWN and ends the session on EXPORT_NAME
//    (which cannot report errors).
//  - NBD_REP_INFO always carries NBD_INFO_EXPORT and NBD_INFO_BLOCK_SIZE
//    (minimum 1, preferred = the device's, maximum kMaxPayloadLength); NAME
//    and DESCRIPTION when asked for.
//  - Metadata contexts "base:allocation", "qemu:allocation-depth" and
//    "qemu:dirty-bitmap:NAME" for each bitmap the export offers; LIST also
//    accepts the namespace queries "base:", "qemu:" and
//    "qemu:dirty-bitmap:" (QEMU's); SET needs exact names. Both need
//    NBD_OPT_STRUCTURED_REPLY first (else ERR_INVALID).
//  - NBD_OPT_STARTTLS (doc/proto.md "TLS support"), as TlsPolicy says: not
//    offered -> NBD_REP_ERR_UNSUP; with data, or once TLS is active ->
//    NBD_REP_ERR_INVALID; else an ack and Next::kStartTls: the connection
//    runs the TLS handshake and continues with a new Negotiator, so no
//    option state from before TLS survives it.
//  - TLS required and not active yet: every option but STARTTLS and ABORT
//    gets NBD_REP_ERR_TLS_REQD, and NBD_OPT_EXPORT_NAME (which has no error
//    reply) ends the session.
//  - Every unknown option: NBD_REP_ERR_UNSUP.
//  - While the server shuts down, every option but ABORT gets
//    NBD_REP_ERR_SHUTDOWN.
//  - At most MaxOptions() options per session (kMaxOptionsPerSession plus
//    one per export, so a client can LIST and then INFO every export): the
//    next one gets NBD_REP_ERR_POLICY and the session ends. An endless
//    option stream would otherwise hold a connection slot (and a thread)
//    forever without ever reaching transmission.
//
// Thread safety: one Negotiator per connection, used by one thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nbd/export.h"
#include "nbd/handshake_codec.h"

namespace thindisk::nbd {

// Context ids are fixed per server: the spec only asks that they be unique
// within a connection.
inline constexpr uint32_t kBaseAllocationContextId = 1;
inline constexpr uint32_t kAllocationDepthContextId = 2;
// The export's bitmap i has id kFirstBitmapContextId + i.
inline constexpr uint32_t kFirstBitmapContextId = 3;

// Options a session may send before transmission, besides one per export.
// Real clients send a handful (qemu and libnbd: under 10; nbdkit allows 32).
inline constexpr size_t kMaxOptionsPerSession = 256;

struct MetaContexts {
  bool base_allocation = false;
  bool allocation_depth = false;
  std::vector<size_t> bitmaps;  // indices into Export::bitmaps, ascending
  bool any() const { return base_allocation || allocation_depth || !bitmaps.empty(); }
  void Add(const MetaContexts& other);
};

// What the server does about TLS on this connection.
struct TlsPolicy {
  bool offered = false;   // STARTTLS is accepted (TLS credentials are loaded)
  bool required = false;  // nothing else is, before TLS
  bool active = false;    // this negotiation runs inside TLS already
};

class Negotiator {
 public:
  enum class Next { kContinue, kTransmission, kClose, kStartTls };
  struct Step {
    Bytes reply;  // send this (may be empty)
    Next next = Next::kContinue;
  };

  // `exports` and `shutting_down` must outlive the Negotiator.
  Negotiator(const std::vector<Export>* exports, ClientFlags client_flags,
             const std::atomic<bool>* shutting_down, TlsPolicy tls = {});

  Step Handle(const Option& option);
  // How many options this session may send (see Policy above).
  size_t MaxOptions() const { return kMaxOptionsPerSession + exports_->size(); }

  // Valid after a Step with Next::kTransmission.
  const Export& chosen_export() const { return *chosen_; }
  bool structured_replies() const { return structured_replies_; }
  MetaContexts meta_contexts() const { return contexts_; }
  uint16_t transmission_flags() const;

 private:
  const Export* Find(const std::string& name) const;
  Step HandleInfoOrGo(const Option& option);
  Step HandleMetaContext(const Option& option);
  Step HandleList(const Option& option);
  Step HandleStartTls(const Option& option);

  const std::vector<Export>* exports_;
  ClientFlags client_flags_;
  const std::atomic<bool>* shutting_down_;
  TlsPolicy tls_;
  const Export* chosen_ = nullptr;
  bool structured_replies_ = false;
  MetaContexts contexts_;
  const Export* contexts_for_ = nullptr;  // the export SET_META_CONTEXT selected for
  size_t options_seen_ = 0;
};

}  // namespace thindisk::nbd
