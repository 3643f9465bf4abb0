// Fuzzes the handling of the Hub's JSON answers: repo_info (the revision
// endpoint: "sha", "siblings") and list_repo_tree (tree pages: "path",
// "type", "size", "oid", "lfs", and the Link header that paginates). The
// answers come from a tiny HTTP server on 127.0.0.1 inside this process, so
// the real client, retries off, parses them.
// Input: byte 0 picks the endpoint (even: revision, odd: tree); for the tree,
// the bytes up to the first NUL are the Link header (CR/LF dropped), the rest
// is the body.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "mem_env.h"
#include "weightlift/hub.h"
#include "weightlift/text.h"

namespace {

std::mutex g_mu;
std::string g_body, g_link;
int g_requests = 0;

void serve(int listener) {
  for (;;) {
    int c = ::accept(listener, nullptr, nullptr);
    if (c < 0) continue;
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos) {
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string body, link;
    {
      std::lock_guard<std::mutex> l(g_mu);
      body = g_body;
      if (g_requests++ == 0) link = g_link;  // one "next page" at most per input
    }
    std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n";
    if (!link.empty()) head += "Link: " + link + "\r\n";
    head += "\r\n";
    std::string out = req.rfind("HEAD", 0) == 0 ? head : head + body;
    size_t off = 0;
    while (off < out.size()) {
      ssize_t n = ::send(c, out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(c);
  }
}

int start_server() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(s, 64) != 0) abort();
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  std::thread(serve, s).detach();
  return ntohs(a.sin_port);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace wl;
  static const int port = start_server();
  if (size < 1) return 0;
  const bool tree = data[0] & 1;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string link;
  if (tree) {
    size_t nul = rest.find('\0');
    if (nul != std::string::npos) {
      link = rest.substr(0, nul);
      link.erase(std::remove_if(link.begin(), link.end(), [](char ch) { return ch == '\r' || ch == '\n'; }), link.end());
      rest = rest.substr(nul + 1);
    }
  }
  {
    std::lock_guard<std::mutex> l(g_mu);
    g_body = rest;
    g_link = link;
    g_requests = 0;
  }
  HubOptions o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(port);
  o.token = "";
  o.offline = false;
  o.cache_dir = "/nonexistent-weightlift-fuzz-cache";
  o.http.retry.max_attempts = 1;
  o.http.connect_timeout_s = 5;
  o.http.stall_timeout_s = 5;
  o.http.dead_host_window_s = 0;  // every input is tried against the server, whatever the last one did
  if (!tree) {
    auto info = repo_info("org/model", "main", o);
    if (info.ok()) {
      WL_FUZZ_CHECK(info->sha.size() == 40);
      for (auto& f : info->files) (void)check_repo_path(f);
    } else {
      WL_FUZZ_CHECK(!info.status().message().empty());
      WL_FUZZ_CHECK(!has_control_chars(info.status().to_string()));
    }
  } else {
    auto entries = list_repo_tree("org/model", "main", "", true, o);
    if (entries.ok()) {
      for (auto& e : *entries) {
        if (check_repo_path(e.path).ok()) {
          // What the cache builds paths from: never absolute, never "..".
          WL_FUZZ_CHECK(!e.path.empty() && e.path.front() != '/');
          WL_FUZZ_CHECK(("/" + e.path + "/").find("/../") == std::string::npos);
          WL_FUZZ_CHECK(!has_control_chars(e.path));  // and never a control character
        }
      }
    } else {
      WL_FUZZ_CHECK(!entries.status().message().empty());
      WL_FUZZ_CHECK(!has_control_chars(entries.status().to_string()));  // what the server sent, inert
    }
  }
  return 0;
}
