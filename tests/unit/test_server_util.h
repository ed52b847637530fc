// Helpers of the server tests: start `kiln serve` on a free port (it prints the port it bound), a small HTTP/1.1
// client over plain sockets (raw bytes can be sent: hostile bodies, half requests, hang-ups), SSE parsing.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"

namespace kiln::test {

using json = nlohmann::json;

struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  std::string log_path;

  // Starts `kiln serve ARGS --port 0` and waits (up to 60 s) for its "ready" line. False with the log on failure.
  bool start(const std::vector<std::string>& args) {
    static int counter = 0;
    log_path = ::kiln::test::temp_dir() + "kiln_serve_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) +
               ".log";
    pid = ::fork();
    if (pid == 0) {
      FILE* f = std::freopen(log_path.c_str(), "w", stderr);
      (void)f;
      std::freopen("/dev/null", "w", stdout);
      // --device cpu unless the test says otherwise: the expected outputs are the CPU's, and on a GPU a token's
      // logits depend on the batch it ran in (GEMV vs tiled GEMM summation order), which random-weight fixtures
      // amplify into different greedy text.
      std::vector<std::string> all = {kiln_binary(), "serve", "--port", "0"};
      bool has_device = false;
      for (const std::string& a : args) has_device = has_device || a == "--device";
      if (!has_device) all.insert(all.end(), {"--device", "cpu"});
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      std::_Exit(127);
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::regex listen_re("listening on http://[^:]+:([0-9]+)");
    while (std::chrono::steady_clock::now() < end) {
      const std::string log = slurp(log_path);
      std::smatch m;
      if (port == 0 && std::regex_search(log, m, listen_re)) port = std::stoi(m[1]);
      if (port != 0 && log.find("kiln serve: ready") != std::string::npos) return true;
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  std::string log() const { return slurp(log_path); }
  // Sends sig and waits up to timeout for the exit; the exit code, -1 when killed by a signal, -2 on timeout.
  int stop(int sig = SIGTERM, int timeout_s = 30) {
    if (pid <= 0) return -3;
    ::kill(pid, sig);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < end) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
    return -2;
  }
  ~ServeProcess() {
    if (pid > 0) stop(SIGKILL, 5);
  }
};

inline int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  timeval tv{120, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

struct HttpResponse {
  int status = 0;
  std::string headers, body;  // body de-chunked
  json j() const {
    try {
      return json::parse(body);
    } catch (...) {
      return json();
    }
  }
};

inline std::string dechunk(const std::string& raw) {
  std::string out;
  size_t p = 0;
  while (p < raw.size()) {
    const size_t e = raw.find("\r\n", p);
    if (e == std::string::npos) break;
    const size_t n = std::stoul(raw.substr(p, e - p), nullptr, 16);
    if (n == 0) break;
    out += raw.substr(e + 2, n);
    p = e + 2 + n + 2;
  }
  return out;
}

inline HttpResponse parse_response(const std::string& raw) {
  HttpResponse r;
  const size_t he = raw.find("\r\n\r\n");
  if (raw.size() < 12 || he == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + 9);
  r.headers = raw.substr(0, he);
  std::string body = raw.substr(he + 4);
  std::string lower = r.headers;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  r.body = lower.find("transfer-encoding: chunked") != std::string::npos ? dechunk(body) : body;
  return r;
}

// One request on its own connection (Connection: close); raw_body is sent as is.
inline HttpResponse http(int port, const std::string& method, const std::string& path, const std::string& body = "",
                         const std::string& api_key = "", const std::string& extra_headers = "") {
  const int fd = connect_to(port);
  if (fd < 0) return {};
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (!api_key.empty()) req += "Authorization: Bearer " + api_key + "\r\n";
  req += extra_headers;
  if (method == "POST") req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n";
  send_all(fd, req);
  send_all(fd, body);
  std::string raw;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return parse_response(raw);
}

// The data: payloads of an SSE body, in order ("[DONE]" included).
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  return out;
}

// Streamed text of choice 0 (chat deltas or completion text) and the finish reason, from the SSE events.
struct Streamed {
  std::string text, finish;
  json usage, timings;
  bool done = false;
  int n_chunks = 0;
};
inline Streamed parse_stream(const std::string& body) {
  Streamed s;
  for (const std::string& e : sse_events(body)) {
    if (e == "[DONE]") {
      s.done = true;
      continue;
    }
    json j = json::parse(e, nullptr, false);
    if (j.is_discarded()) continue;
    ++s.n_chunks;
    if (j.contains("usage") && !j["usage"].is_null()) s.usage = j["usage"];
    if (j.contains("timings")) s.timings = j["timings"];
    if (!j.contains("choices") || j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string())
      s.text += c["delta"]["content"].get<std::string>();
    if (c.contains("text") && c["text"].is_string()) s.text += c["text"].get<std::string>();
    if (c.contains("finish_reason") && c["finish_reason"].is_string()) s.finish = c["finish_reason"];
  }
  return s;
}

// A metric's value from /metrics text (the first line that starts with `name`), or -1.
inline double metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

}  // namespace kiln::test
