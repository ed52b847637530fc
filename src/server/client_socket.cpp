#include "server/client_socket.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>

namespace kiln::server {

namespace {

// The numeric address and port of a socket address, as httplib writes them (getnameinfo, NI_NUMERICHOST).
bool address_of(const sockaddr_storage& a, socklen_t len, std::string* ip, int* port) {
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  *ip = host;
  if (a.ss_family == AF_INET) *port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  else if (a.ss_family == AF_INET6) *port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  else return false;
  return true;
}

}  // namespace

ApiError client_closed_error() {
  ApiError e;
  e.status = kClientClosed;
  e.code = "client_closed_request";
  e.message = "the client closed the connection before the answer; the request was cancelled";
  return e;
}

ClientWatch::ClientWatch(const httplib::Request& req)
    : remote_addr_(req.remote_addr), remote_port_(req.remote_port), local_port_(req.local_port) {}

int ClientWatch::find_socket() const {
  if (remote_port_ < 0 || local_port_ < 0) return -1;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&a), &len) != 0) continue;  // not a socket
    std::string ip;
    int port = -1;
    if (!address_of(a, len, &ip, &port) || port != remote_port_ || ip != remote_addr_) continue;
    len = sizeof a;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&a), &len) != 0) continue;
    if (!address_of(a, len, &ip, &port) || port != local_port_) continue;
    found = static_cast<int>(fd);  // one TCP connection per address pair
    break;
  }
  closedir(d);
  return found;
}

bool ClientWatch::gone() {
  // The socket stays this request's while its handler runs (httplib closes it after the handler returns).
  if (fd_ == -2) fd_ = find_socket();
  if (fd_ < 0) return false;
  char c;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;  // the client closed its end
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;  // reset
}

bool wait_while_connected(const std::vector<std::shared_ptr<RequestHandle>>& hs, ClientWatch& client,
                          std::chrono::milliseconds poll) {
  for (const auto& h : hs) {
    while (!h->wait_done(poll)) {
      if (!client.gone()) continue;
      for (const auto& o : hs)
        if (!o->finished()) o->cancel();
      return false;
    }
  }
  return true;
}

}  // namespace kiln::server
