// The NBD server's TLS on GnuTLS (nbd/tls.h): the body of the module
// thindisk-tls.so (nbd/tls_module_abi.h). The binary reaches it through
// TlsServer::Create; tests and the fuzzer may link it directly.
#pragma once

#include <memory>

#include "nbd/tls.h"
#include "util/result.h"

namespace thindisk::nbd {

// TlsServer::Create's work: reads the credentials and the authz list.
Result<std::shared_ptr<TlsServer>> CreateGnutlsServer(TlsSettings settings);

}  // namespace thindisk::nbd
