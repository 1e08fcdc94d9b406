#include "nbd/tls_gnutls.h"

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "nbd/fd_io.h"
#include "nbd/tls_authz.h"
#include "nbd/tls_credentials.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace thindisk::nbd {
namespace {

// A TLS session over (in_fd, out_fd), as a Transport. GnuTLS reads through
// Pull and writes through Push, both buffered: GnuTLS asks for a record's
// header and then its body (and sends record by record), so unbuffered a
// 1 MiB request would cost some 256 system calls instead of a handful.
// Pull takes what has arrived (up to kInBuffer) through fd_io's read,
// which watches the cancel descriptor. Inside Encrypt, Push collects
// records (WriteAllV sends them kOutBuffer at a time, TrySendV without
// blocking); elsewhere (handshake, alerts, close_notify) it sends at once.
//
// The reader and the sender share one GnuTLS session, and GnuTLS 3.7 keeps
// both directions' keys in one epoch: a TLS 1.3 key update makes a new
// epoch that copies the other direction's record sequence number as it is
// at that moment. So session_mu_ makes the session one thread's at a time:
// the reader holds it inside gnutls_record_recv except while Pull waits for
// the socket, the sender while it encrypts except while Push waits for the
// socket, and neither waits on anything else holding it. A KeyUpdate from
// the client (GnuTLS clients send one every 2^24 records) is then processed
// while no record is being encrypted.
//
// An update of our own keys copies the read sequence number the same way,
// and GnuTLS picks the read epoch before Pull waits for a record and
// decrypts with it after, so it is safe only while the reader is outside
// gnutls_record_recv (a tls_key_update_test run broke the stream when
// GnuTLS rekeyed on its own). So GnuTLS does not (GNUTLS_NO_AUTO_REKEY):
// the reader waits for the next bytes outside gnutls_record_recv, and the
// sender renews its keys at the start of an Encrypt that finds the reader
// there, after rekey_records records under one key, or when the client
// asked for it (its KeyUpdate's update_requested; gnutls_record_cork drops
// the plan GnuTLS makes for that). Until such a moment the old keys stay:
// with the reader mid-record for long (a client stalled inside a record),
// the renewal waits.
class TlsTransport final : public Transport {
 public:
  TlsTransport(int in_fd, int out_fd, int cancel_fd,
               std::shared_ptr<const TlsCredentials> creds, uint64_t rekey_records)
      : in_fd_(in_fd),
        out_fd_(out_fd),
        cancel_fd_(cancel_fd),
        creds_(std::move(creds)),
        rekey_records_(rekey_records),
        out_pipe_(!IsSocket(out_fd)) {}
  ~TlsTransport() override {
    if (!session_) return;
    if (established_) {
      // close_notify, without waiting on a client that stopped reading.
      closing_.store(true, std::memory_order_relaxed);
      (void)FlushOut(/*block=*/false);  // records come before close_notify
      if (!HasUnsent()) (void)gnutls_bye(session_, GNUTLS_SHUT_WR);
    }
    gnutls_deinit(session_);
  }

  // Runs the handshake (see TlsServer::Handshake). `names` receives the
  // client's identity: a PSK user name, or its certificate's DN in RFC 4514
  // order and in the certificate's order (none without a certificate).
  Status Start(bool verify_peer, std::vector<std::string>* names);
  // Tells the client it is refused (a fatal access_denied alert).
  void Refuse() { (void)gnutls_alert_send(session_, GNUTLS_AL_FATAL, GNUTLS_A_ACCESS_DENIED); }

  Result<size_t> ReadAtLeast(std::span<uint8_t> buf, size_t min) override;
  Status WriteAllV(std::span<const iovec> iov) override;
  Result<size_t> TrySendV(std::span<const iovec> iov) override;
  bool HasUnsent() const override { return out_sent_ < out_buf_.size(); }
  void Shutdown() override {
    (void)shutdown(out_fd_, SHUT_RDWR);
    if (in_fd_ != out_fd_) (void)shutdown(in_fd_, SHUT_RDWR);
  }

 private:
  static ssize_t Pull(gnutls_transport_ptr_t p, void* data, size_t size);
  static int PullTimeout(gnutls_transport_ptr_t p, unsigned int ms);
  static ssize_t Push(gnutls_transport_ptr_t p, const giovec_t* iov, int count);
  // Reads what has arrived into in_buf_ (at least a byte, waiting for it
  // while watching the cancel descriptor). Reader only.
  Status Fill();
  // A KeyUpdate's hook: notes a client's request for ours (update_due_).
  static int OnKeyUpdate(gnutls_session_t session, unsigned htype, unsigned when,
                         unsigned incoming, const gnutls_datum_t* msg);
  // Renews the sending keys when due and safe (class comment); in Encrypt.
  Status MaybeRekey();
  // Sends what out_buf_ holds: all of it (block), or what the socket
  // takes now.
  Status FlushOut(bool block);
  // Encrypts `iov` into out_buf_ (stream: sending it kOutBuffer at a time).
  Status Encrypt(std::span<const iovec> iov, bool stream);
  static constexpr size_t kDirectMax = 256u << 10;
  static constexpr size_t kInBuffer = 128u << 10;
  static constexpr size_t kOutBuffer = 256u << 10;
  // A GnuTLS error of a read as a Status (`done`: bytes of this read so far).
  Status ReadError(int r, size_t done) const;
  Status Identity(std::vector<std::string>* names) const;

  const int in_fd_;
  const int out_fd_;
  const int cancel_fd_;
  const std::shared_ptr<const TlsCredentials> creds_;
  const uint64_t rekey_records_;   // 0: never renew our keys
  gnutls_session_t session_ = nullptr;
  bool established_ = false;
  bool cancelled_ = false;         // reader only: Pull saw the cancel descriptor
  // The session is one thread's (class comment). A plain std::mutex: Pull
  // lets it go and takes it again only when the reader holds it
  // (reading_), a conditional hold the analysis cannot follow.
  std::mutex session_mu_;
  bool reading_ = false;           // inside gnutls_record_recv (guarded by session_mu_)
  bool update_due_ = false;        // the client asked for our KeyUpdate (session_mu_)
  std::vector<uint8_t> in_buf_;    // reader only: [in_pos_, in_end_) not yet pulled
  size_t in_pos_ = 0;
  size_t in_end_ = 0;
  const bool out_pipe_;            // out_fd_ is no socket (--stdio)
  // The sender's (whoever holds the connection's sending token):
  bool buffering_ = false;         // inside Encrypt
  bool stream_ = false;            // Encrypt may send as it goes
  std::vector<uint8_t> out_buf_;   // records; [out_sent_, end) not sent yet
  size_t out_sent_ = 0;
  std::atomic<bool> closing_{false};  // Push must not block any more
};

Status TlsTransport::Fill() {
  if (in_buf_.empty()) in_buf_.resize(kInBuffer);
  // What has arrived, up to kInBuffer: fd_io's read takes queued bytes
  // without a poll, and otherwise waits watching the cancel descriptor.
  Result<size_t> got = nbd::ReadAtLeast(in_fd_, in_buf_, 1, cancel_fd_);
  if (!got.has_value()) {
    if (got.error().code() == Code::kBusy) cancelled_ = true;
    return got.error();
  }
  in_pos_ = 0;
  in_end_ = *got;
  return Status::Ok();
}

ssize_t TlsTransport::Pull(gnutls_transport_ptr_t p, void* data, size_t size) {
  auto* t = static_cast<TlsTransport*>(p);
  if (t->in_pos_ == t->in_end_) {
    // Mid-record (or in the handshake): the sender may have the session
    // while this waits.
    if (t->reading_) t->session_mu_.unlock();
    Status st = t->Fill();
    if (t->reading_) t->session_mu_.lock();
    if (!st.ok()) {
      if (st.code() == Code::kNotFound) return 0;  // end of stream
      int e = st.error_number() ? st.error_number() : EIO;
      if (st.code() == Code::kBusy) e = ECANCELED;
      gnutls_transport_set_errno(t->session_, e);
      return -1;
    }
  }
  const size_t n = std::min(size, t->in_end_ - t->in_pos_);
  std::memcpy(data, t->in_buf_.data() + t->in_pos_, n);
  t->in_pos_ += n;
  return ssize_t(n);
}

int TlsTransport::OnKeyUpdate(gnutls_session_t session, unsigned, unsigned, unsigned incoming,
                              const gnutls_datum_t* msg) {
  // KeyUpdate's body is one byte: 1 is update_requested (RFC 8446 4.6.3).
  // Called by the reader inside gnutls_record_recv, holding session_mu_.
  if (incoming && msg && msg->size >= 1 && msg->data[0] == 1) {
    static_cast<TlsTransport*>(gnutls_session_get_ptr(session))->update_due_ = true;
  }
  return 0;
}

Status TlsTransport::MaybeRekey() {
  if (reading_ || gnutls_protocol_get_version(session_) != GNUTLS_TLS1_3) return Status::Ok();
  bool due = update_due_;
  if (!due && rekey_records_ > 0) {
    unsigned char seq[8];
    if (gnutls_record_get_state(session_, /*read=*/0, nullptr, nullptr, nullptr, seq) < 0)
      return Status::Ok();
    uint64_t sent = 0;
    for (unsigned char b : seq) sent = sent << 8 | b;
    due = sent >= rekey_records_;
  }
  if (!due) return Status::Ok();
  int r;
  do {
    r = gnutls_session_key_update(session_, 0);
  } while (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED);
  if (r < 0) return Status(Code::kIoError, "TLS: key update: " + GnutlsMessage(r));
  update_due_ = false;
  return Status::Ok();
}

int TlsTransport::PullTimeout(gnutls_transport_ptr_t p, unsigned int ms) {
  auto* t = static_cast<TlsTransport*>(p);
  if (t->in_pos_ < t->in_end_) return 1;
  pollfd fds[2] = {{t->in_fd_, POLLIN, 0}, {t->cancel_fd_, POLLIN, 0}};
  const int timeout = ms == GNUTLS_INDEFINITE_TIMEOUT ? -1 : int(ms);
  for (;;) {
    const int n = poll(fds, t->cancel_fd_ >= 0 ? 2 : 1, timeout);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) gnutls_transport_set_errno(t->session_, errno);
    return n;  // readable (or cancelled: Pull then says so), 0 on timeout
  }
}

Status TlsTransport::FlushOut(bool block) {
  while (out_sent_ < out_buf_.size()) {
    iovec v{out_buf_.data() + out_sent_, out_buf_.size() - out_sent_};
    if (block) {
      Status st = nbd::WriteAllV(out_fd_, std::span<const iovec>(&v, 1));
      if (!st.ok()) return Status(Code::kIoError, "TLS: write: " + st.message(), st.error_number());
      break;
    }
    TD_ASSIGN_OR_RETURN(size_t n, nbd::TrySendV(out_fd_, std::span<const iovec>(&v, 1)));
    if (n == 0) return Status::Ok();  // full: the rest waits (HasUnsent)
    out_sent_ += n;
  }
  out_buf_.clear();
  out_sent_ = 0;
  return Status::Ok();
}

ssize_t TlsTransport::Push(gnutls_transport_ptr_t p, const giovec_t* iov, int count) {
  auto* t = static_cast<TlsTransport*>(p);
  if (t->buffering_) {
    size_t total = 0;
    for (int i = 0; i < count; ++i) {
      const size_t len = iov[i].iov_len;
      if (len == 0) continue;
      const size_t at = t->out_buf_.size();
      t->out_buf_.resize(at + len);
      std::memcpy(t->out_buf_.data() + at, iov[i].iov_base, len);
      total += len;
    }
    if (t->stream_ && t->out_buf_.size() >= kOutBuffer) {
      // Inside Encrypt, which holds session_mu_: the reader may have the
      // session while this waits for the socket.
      t->session_mu_.unlock();
      Status st = t->FlushOut(/*block=*/true);
      t->session_mu_.lock();
      if (!st.ok()) {
        gnutls_transport_set_errno(t->session_, st.error_number() ? st.error_number() : EIO);
        return -1;
      }
    }
    return ssize_t(total);
  }
  // The handshake, alerts and close_notify: sent at once, all of it, but
  // without waiting on a client that stopped reading once closing.
  const std::span<const iovec> v(reinterpret_cast<const iovec*>(iov), size_t(count));
  size_t total = 0;
  for (const iovec& piece : v) total += piece.iov_len;
  Result<size_t> n = total;
  if (t->closing_.load(std::memory_order_relaxed) && !t->out_pipe_) {
    n = nbd::TrySendV(t->out_fd_, v);
    if (n.has_value() && *n == 0) {
      gnutls_transport_set_errno(t->session_, EAGAIN);
      return -1;
    }
  } else if (Status st = nbd::WriteAllV(t->out_fd_, v); !st.ok()) {
    n = st;
  }
  if (!n.has_value()) {
    gnutls_transport_set_errno(t->session_,
                               n.error().error_number() ? n.error().error_number() : EIO);
    return -1;
  }
  return ssize_t(*n);
}

Status TlsTransport::Start(bool verify_peer, std::vector<std::string>* names) {
  int r = gnutls_init(&session_, GNUTLS_SERVER | GNUTLS_NO_AUTO_REKEY);
  if (r < 0) return Status(Code::kIoError, "TLS: " + GnutlsMessage(r));
  r = creds_->Apply(session_, verify_peer);
  if (r < 0) return Status(Code::kIoError, "TLS: " + GnutlsMessage(r));
  gnutls_transport_set_ptr(session_, this);
  gnutls_transport_set_pull_function(session_, Pull);
  gnutls_transport_set_pull_timeout_function(session_, PullTimeout);
  gnutls_transport_set_vec_push_function(session_, Push);
  gnutls_session_set_ptr(session_, this);
  gnutls_handshake_set_hook_function(session_, GNUTLS_HANDSHAKE_KEY_UPDATE, GNUTLS_HOOK_POST,
                                     OnKeyUpdate);
  // The server's handshake timeout cuts the socket; GnuTLS keeps none.
  gnutls_handshake_set_timeout(session_, GNUTLS_INDEFINITE_TIMEOUT);
  do {
    r = gnutls_handshake(session_);
  } while (r < 0 && gnutls_error_is_fatal(r) == 0 && !cancelled_);
  if (cancelled_) return Status::Busy("cancelled");
  if (r < 0) {
    if (r == GNUTLS_E_PREMATURE_TERMINATION || r == GNUTLS_E_UNEXPECTED_PACKET_LENGTH)
      return Status::NotFound("client hung up during the TLS handshake");
    std::string why = GnutlsMessage(r);
    if (r == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
      gnutls_datum_t out{};
      const unsigned status = gnutls_session_get_verify_cert_status(session_);
      if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0) == 0) {
        why = "client certificate refused: " + std::string(reinterpret_cast<char*>(out.data));
        gnutls_free(out.data);
      }
    }
    (void)gnutls_alert_send_appropriate(session_, r);
    return Status(Code::kIoError, "TLS handshake failed: " + why);
  }
  established_ = true;
  return Identity(names);
}

Status TlsTransport::Identity(std::vector<std::string>* names) const {
  names->clear();
  if (creds_->psk()) {
    const char* user = gnutls_psk_server_get_username(session_);
    if (user) names->push_back(user);
    return Status::Ok();
  }
  unsigned n = 0;
  const gnutls_datum_t* certs = gnutls_certificate_get_peers(session_, &n);
  if (!certs || n == 0) return Status::Ok();  // verify_peer off: anonymous
  gnutls_x509_crt_t crt;
  if (gnutls_x509_crt_init(&crt) < 0) return Status(Code::kIoError, "TLS: out of memory");
  int r = gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER);
  for (unsigned flags : {0u, unsigned(GNUTLS_X509_DN_FLAG_COMPAT)}) {
    gnutls_datum_t dn{};
    if (r >= 0) r = gnutls_x509_crt_get_dn3(crt, &dn, flags);
    if (r < 0) break;
    std::string name(reinterpret_cast<char*>(dn.data), dn.size);
    gnutls_free(dn.data);
    if (names->empty() || names->front() != name) names->push_back(std::move(name));
  }
  gnutls_x509_crt_deinit(crt);
  if (r < 0) return Status(Code::kIoError, "TLS: client certificate: " + GnutlsMessage(r));
  return Status::Ok();
}

Status TlsTransport::ReadError(int r, size_t done) const {
  if (cancelled_) return Status::Busy("cancelled");
  // End of stream, with or without close_notify: at a message boundary the
  // client hung up (nothing it sent is lost), inside one it broke off.
  if (r == 0 || r == GNUTLS_E_PREMATURE_TERMINATION) {
    if (done == 0) return Status::NotFound("end of stream");
    return Status(Code::kIoError, "connection closed mid-message");
  }
  if (r == GNUTLS_E_REHANDSHAKE)
    return Status(Code::kIoError, "TLS: the client asked to renegotiate (refused)");
  return Status(Code::kIoError, "TLS: " + GnutlsMessage(r));
}

Result<size_t> TlsTransport::ReadAtLeast(std::span<uint8_t> buf, size_t min) {
  size_t done = 0;
  while (done < min || (done < buf.size() && gnutls_record_check_pending(session_) > 0)) {
    // Nothing buffered: wait for the next bytes here, outside
    // gnutls_record_recv, where the sender may renew its keys.
    if (in_pos_ == in_end_ && gnutls_record_check_pending(session_) == 0) {
      if (Status st = Fill(); !st.ok()) {
        if (st.code() == Code::kNotFound) return ReadError(0, done);
        if (cancelled_) return ReadError(GNUTLS_E_PULL_ERROR, done);
        return Status(Code::kIoError, "TLS: read: " + st.message(), st.error_number());
      }
    }
    std::unique_lock<std::mutex> lock(session_mu_);
    reading_ = true;
    const ssize_t n = gnutls_record_recv(session_, buf.data() + done, buf.size() - done);
    reading_ = false;
    lock.unlock();
    if (n > 0) {
      done += size_t(n);
      continue;
    }
    if ((n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) && !cancelled_) continue;
    return ReadError(int(n), done);
  }
  return done;
}

Status TlsTransport::Encrypt(std::span<const iovec> iov, bool stream) {
  // Small pieces (reply headers) share records with what follows them; the
  // cork is lifted every 256 KiB so a batch of large replies is not held in
  // GnuTLS's buffer whole.
  constexpr size_t kUncorkEvery = 256u << 10;
  size_t corked = 0;
  std::lock_guard<std::mutex> session(session_mu_);
  buffering_ = true;
  stream_ = stream;
  struct Unbuffer {
    TlsTransport* t;
    ~Unbuffer() { t->buffering_ = false; }
  } unbuffer{this};
  TD_RETURN_IF_ERROR(MaybeRekey());  // its KeyUpdate goes through Push, first
  gnutls_record_cork(session_);
  for (const iovec& v : iov) {
    const auto* p = static_cast<const uint8_t*>(v.iov_base);
    size_t left = v.iov_len;
    while (left > 0) {
      const ssize_t n = gnutls_record_send(session_, p, left);
      if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) continue;
      if (n < 0) return Status(Code::kIoError, "TLS: write: " + GnutlsMessage(int(n)));
      p += n;
      left -= size_t(n);
      corked += size_t(n);
    }
    if (corked >= kUncorkEvery) {
      const int r = gnutls_record_uncork(session_, GNUTLS_RECORD_WAIT);
      if (r < 0) return Status(Code::kIoError, "TLS: write: " + GnutlsMessage(r));
      corked = 0;
      gnutls_record_cork(session_);
    }
  }
  const int r = gnutls_record_uncork(session_, GNUTLS_RECORD_WAIT);
  if (r < 0) return Status(Code::kIoError, "TLS: write: " + GnutlsMessage(r));
  return Status::Ok();
}

Status TlsTransport::WriteAllV(std::span<const iovec> iov) {
  TD_RETURN_IF_ERROR(FlushOut(/*block=*/true));  // what a direct send left
  TD_RETURN_IF_ERROR(Encrypt(iov, /*stream=*/true));
  return FlushOut(/*block=*/true);
}

Result<size_t> TlsTransport::TrySendV(std::span<const iovec> iov) {
  if (out_pipe_) return Status::NotSupported("a pipe: replies go through the writer");
  size_t total = 0;
  for (const iovec& v : iov) total += v.iov_len;
  // Large replies stream from the writer (their ciphertext is not held
  // whole); so do all replies while earlier ciphertext still waits.
  if (total > kDirectMax) return size_t(0);
  TD_RETURN_IF_ERROR(FlushOut(/*block=*/false));
  if (out_sent_ < out_buf_.size()) return size_t(0);
  // Once encrypted the bytes are consumed: what the socket does not take
  // now waits in out_buf_ (HasUnsent) for the writer, before anything else.
  TD_RETURN_IF_ERROR(Encrypt(iov, /*stream=*/false));
  TD_RETURN_IF_ERROR(FlushOut(/*block=*/false));
  return total;
}

// The TlsServer of nbd/tls.h on GnuTLS.
class GnutlsServer final : public TlsServer {
 public:
  explicit GnutlsServer(TlsSettings settings) : settings_(std::move(settings)) {}

  // Reads the credentials and the authz list for the first time.
  Status Init() {
    TD_ASSIGN_OR_RETURN(State s, Load());
    util::MutexLock lock(mu_);
    state_ = std::move(s);
    return Status::Ok();
  }

  const TlsSettings& settings() const override { return settings_; }

  Status Reload() override {
    TD_ASSIGN_OR_RETURN(State s, Load());
    util::MutexLock lock(mu_);
    state_ = std::move(s);
    return Status::Ok();
  }

  Result<std::unique_ptr<Transport>> Handshake(int in_fd, int out_fd,
                                               int cancel_fd) const override;

 private:
  struct State {
    std::shared_ptr<const TlsCredentials> creds;
    std::shared_ptr<const TlsAuthz> authz;
  };

  Result<State> Load() const {
    State s;
    TD_ASSIGN_OR_RETURN(s.creds, TlsCredentials::Load(settings_));
    TlsAuthz authz;
    if (!settings_.authz_file.empty()) {
      TD_ASSIGN_OR_RETURN(authz, TlsAuthz::LoadListFile(settings_.authz_file));
    }
    for (const std::string& pattern : settings_.allow) authz.AllowGlob(pattern);
    s.authz = std::make_shared<const TlsAuthz>(std::move(authz));
    return s;
  }

  State Current() const {
    util::MutexLock lock(mu_);
    return state_;
  }

  const TlsSettings settings_;
  mutable util::Mutex mu_;
  State state_ TD_GUARDED_BY(mu_);
};

Result<std::unique_ptr<Transport>> GnutlsServer::Handshake(int in_fd, int out_fd,
                                                          int cancel_fd) const {
  const State state = Current();
  auto t = std::make_unique<TlsTransport>(in_fd, out_fd, cancel_fd, state.creds,
                                          settings_.rekey_records);
  std::vector<std::string> names;
  TD_RETURN_IF_ERROR(t->Start(settings_.verify_peer, &names));
  if (!state.authz->AllowsAny(names)) {
    t->Refuse();
    const std::string who = names.empty() ? "a client without a certificate"
                                          : "TLS client '" + names.front() + "'";
    return Status::Busy(who + " is not authorized (--tls-authz/--tls-allow)");
  }
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace

Result<std::shared_ptr<TlsServer>> CreateGnutlsServer(TlsSettings settings) {
  auto server = std::make_shared<GnutlsServer>(std::move(settings));
  TD_RETURN_IF_ERROR(server->Init());
  return std::shared_ptr<TlsServer>(std::move(server));
}

}  // namespace thindisk::nbd
