#include "nbdclient/list_exports.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <libnbd.h>

#include "nbdclient/connection.h"  // LibnbdError

namespace thindisk::nbdclient {
namespace {

struct Listed {
  std::string name, description;
};

// NBD transmission flags (doc/proto.md "Transmission flags") by bit, with
// the names qemu-nbd -L prints; RESIZE (bit 9) is not reported by libnbd.
struct FlagBit {
  int bit;
  const char* name;
  int (*has)(struct nbd_handle*);
};
const FlagBit kFlagBits[] = {
    {1, "readonly", nbd_is_read_only}, {2, "flush", nbd_can_flush},
    {3, "fua", nbd_can_fua},           {4, "rotational", nbd_is_rotational},
    {5, "trim", nbd_can_trim},         {6, "zeroes", nbd_can_zero},
    {7, "df", nbd_can_df},             {8, "multi", nbd_can_multi_conn},
    {10, "cache", nbd_can_cache},      {11, "fast-zero", nbd_can_fast_zero},
};

class Handle {
 public:
  Handle() : h_(nbd_create()) {}
  ~Handle() { nbd_close(h_); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  struct nbd_handle* get() const { return h_; }

 private:
  struct nbd_handle* h_;
};

// One export's block, from NBD_OPT_INFO and NBD_OPT_LIST_META_CONTEXT.
Status PrintExport(struct nbd_handle* h, const Listed& e, const std::string& server) {
  std::printf(" export: '%s'\n", e.name.c_str());
  if (!e.description.empty()) std::printf("  description: %s\n", e.description.c_str());
  if (nbd_set_export_name(h, e.name.c_str()) == -1 || nbd_opt_info(h) == -1)
    return LibnbdError(server + ": export '" + e.name + "'");
  int64_t size = nbd_get_size(h);
  if (size < 0) return LibnbdError(server + ": size of export '" + e.name + "'");
  unsigned flags = 1;  // NBD_FLAG_HAS_FLAGS
  std::string names;
  for (const FlagBit& f : kFlagBits) {
    if (f.has(h) == 1) {
      flags |= 1u << f.bit;
      names += std::string(" ") + f.name;
    }
  }
  std::printf("  size:  %" PRId64 "\n", size);
  std::printf("  flags: 0x%x (%s )\n", flags, names.c_str());
  int64_t min = nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
  if (min > 0) {
    std::printf("  min block: %" PRId64 "\n", min);
    std::printf("  opt block: %" PRId64 "\n", nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED));
    std::printf("  max block: %" PRId64 "\n", nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM));
  }
  std::vector<std::string> contexts;
  nbd_context_callback collect = {
      .callback = [](void* user, const char* name) {
        static_cast<std::vector<std::string>*>(user)->push_back(name);
        return 0;
      },
      .user_data = &contexts,
      .free = nullptr};
  // A server without structured replies has no contexts to list.
  if (nbd_opt_list_meta_context(h, collect) == -1) contexts.clear();
  if (!contexts.empty()) {
    std::printf("  available meta contexts: %zu\n", contexts.size());
    for (const std::string& c : contexts) std::printf("   %s\n", c.c_str());
  }
  return Status::Ok();
}

// The server's name is checked against the certificate: the connected
// host's over TCP; --tls-hostname's where libnbd can be told another
// (nbd_set_tls_hostname, not in Debian 12's libnbd 1.14), else it is
// refused rather than left unchecked. Over a Unix socket without a name,
// libnbd checks the certificate chain only.
Status SetTls(struct nbd_handle* h, const ListTarget& target) {
  const ListTls& tls = target.tls;
  if (tls.mode == nbd::TlsMode::kOff) return Status::Ok();
  const auto failed = [] { return LibnbdError("-L/--list: TLS"); };
  const int mode = tls.mode == nbd::TlsMode::kRequire ? LIBNBD_TLS_REQUIRE : LIBNBD_TLS_ALLOW;
  if (nbd_set_tls(h, mode) == -1) return failed();
  if (!tls.x509_dir.empty() && nbd_set_tls_certificates(h, tls.x509_dir.c_str()) == -1)
    return failed();
  if (!tls.psk_file.empty() && (nbd_set_tls_psk_file(h, tls.psk_file.c_str()) == -1 ||
                                nbd_set_tls_username(h, tls.username.c_str()) == -1))
    return failed();
#ifdef LIBNBD_HAVE_NBD_SET_TLS_HOSTNAME
  if (!tls.hostname.empty() && nbd_set_tls_hostname(h, tls.hostname.c_str()) == -1)
    return failed();
#else
  if (!tls.hostname.empty() && (!target.unix_socket.empty() || tls.hostname != target.host))
    return Status::NotSupported(
        "--tls-hostname " + tls.hostname + ": this libnbd checks the server's certificate "
        "against the host it connects to (-b), not another name" +
        (target.unix_socket.empty() ? "" : "; over a Unix socket leave --tls-hostname out "
                                           "(the certificate chain is still verified)"));
#endif
  if (nbd_set_tls_verify_peer(h, tls.verify_peer) == -1) return failed();
  return Status::Ok();
}

}  // namespace

Status ListExports(const ListTarget& target) {
  const std::string server = target.Server();
  Handle handle;
  struct nbd_handle* h = handle.get();
  if (h == nullptr) return LibnbdError("-L/--list");
  if (nbd_set_opt_mode(h, true) == -1) return LibnbdError("-L/--list");
  TD_RETURN_IF_ERROR(SetTls(h, target));
  int rc = target.unix_socket.empty()
               ? nbd_connect_tcp(h, target.host.c_str(), std::to_string(target.port).c_str())
               : nbd_connect_unix(h, target.unix_socket.c_str());
  if (rc == -1) return LibnbdError("-L/--list: connect to " + server);

  std::vector<Listed> exports;
  nbd_list_callback collect = {
      .callback = [](void* user, const char* name, const char* description) {
        static_cast<std::vector<Listed>*>(user)->push_back({name, description ? description : ""});
        return 0;
      },
      .user_data = &exports,
      .free = nullptr};
  if (nbd_opt_list(h, collect) == -1) {
    Status s = LibnbdError(server + ": listing exports");
    if (target.tls.mode != nbd::TlsMode::kOff) return s;
    return Status::Internal(s.message() + " (a server that requires TLS refuses a plaintext "
                                          "listing: give --tls-creds)");
  }
  std::printf("exports available: %zu\n", exports.size());
  for (const Listed& e : exports) TD_RETURN_IF_ERROR(PrintExport(h, e, server));
  (void)nbd_opt_abort(h);
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace thindisk::nbdclient
