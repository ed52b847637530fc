// GET / : the chat page (server/webui/index.html, linked in by webui.S), unless --no-webui. The page holds no
// secret, so it loads without the API key (it asks for one when the API answers 401); its Content-Security-Policy
// allows nothing but this server, so it works offline and can load nothing from elsewhere.
#include <httplib.h>

#include "server/routes.h"

extern "C" const char kiln_webui_begin[];
extern "C" const char kiln_webui_end[];

namespace kiln::server {

void add_webui_route(httplib::Server& http, RouteHost& host) {
  http.Get("/", [&host](const httplib::Request& req, httplib::Response& res) {
    const uint64_t id = host.next_request_id();
    if (!host.config().webui) {
      ApiError e;
      e.status = 404;
      e.code = "not_found";
      e.message = "the chat page is turned off (kiln serve --no-webui)";
      res.status = 404;
      res.set_content(dump(error_body(e)), "application/json");
      return host.log(id, req, 404, nullptr, 0, nullptr);
    }
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:");
    res.set_header("Cache-Control", "no-cache");
    res.set_content(std::string(kiln_webui_begin, static_cast<size_t>(kiln_webui_end - kiln_webui_begin)),
                    "text/html; charset=utf-8");
    host.log(id, req, 200, nullptr, 0, nullptr);
  });
}

}  // namespace kiln::server
