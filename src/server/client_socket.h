// Whether the client of a request answered in one piece (not streamed) is still there while the handler waits for
// the engine loop. httplib 0.11 neither tells a handler that its client hung up nor hands it the socket: the
// socket is found among the process's descriptors by the connection's two addresses (what getpeername and
// getsockname give, as httplib wrote them into the Request), then peeked without blocking: an orderly close (FIN)
// or a reset means the client is gone. A client that only half-closes (shuts down its sending side and still reads)
// reads as gone too; HTTP clients do not do that.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runtime/request.h"
#include "server/openai.h"

namespace httplib {
struct Request;
}

namespace kiln::server {

// The status logged for a request whose client hung up before the answer (nginx's 499). Its body is never sent;
// it is there so that httplib does not treat the response as one to fill in itself.
inline constexpr int kClientClosed = 499;
ApiError client_closed_error();

class ClientWatch {
 public:
  explicit ClientWatch(const httplib::Request& req);
  // True once the client closed or reset the connection; false while it is open or when its socket is not found.
  bool gone();

 private:
  int find_socket() const;  // -1 when none matches
  std::string remote_addr_;
  int remote_port_ = -1, local_port_ = -1;
  int fd_ = -2;  // -2: not looked up yet
};

// Waits until every handle finished, looking at the client every `poll`; a client that hung up cancels the
// handles still running (their KV blocks are freed at the engine's next step) and the wait ends: false.
bool wait_while_connected(const std::vector<std::shared_ptr<RequestHandle>>& hs, ClientWatch& client,
                          std::chrono::milliseconds poll = std::chrono::milliseconds(100));

}  // namespace kiln::server
