// What /status, /status.csv, /metrics and the page say about outages,
// retired servers, where servers came from, and the page's summary rows.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/unit/admin/fixture.hpp"

using namespace sluice;
using namespace sluice::admin;
using sluice::admin::testing::Fixture;
using sluice::admin::testing::request;

namespace {

// RFC 4180 reader, enough for these tests: quoted fields, doubled quotes, CRLF.
std::vector<std::vector<std::string>> read_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows(1);
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        field += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        field += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().push_back(field);
      field.clear();
    } else if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') {
      rows.back().push_back(field);
      field.clear();
      rows.emplace_back();
      ++i;
    } else {
      field += c;
    }
  }
  rows.pop_back();  // after the last CRLF
  return rows;
}

// Row of `type` whose column `key` is `value`, as column -> cell.
std::map<std::string, std::string> csv_row(const std::vector<std::vector<std::string>>& rows, const std::string& type,
                                           const std::string& key, const std::string& value) {
  const std::vector<std::string>& head = rows.at(0);
  for (std::size_t r = 1; r < rows.size(); ++r) {
    REQUIRE(rows[r].size() == head.size());
    std::map<std::string, std::string> m;
    for (std::size_t i = 0; i < head.size(); ++i) m[head[i]] = rows[r][i];
    if (m["type"] == type && m[key] == value) return m;
  }
  FAIL("no " << type << " row with " << key << " = " << value);
  return {};
}

}  // namespace

TEST_CASE("/status: eligible servers and why the others are not, the header's facts, where servers came from") {
  Fixture f;
  Upstream* up = f.snapshot->find_upstream("pg");
  up->server(0).set_admin(AdminState::drain);
  nlohmann::json s = status_json(*f.snapshot, f.info, Clock::now(), 3500);
  CHECK(s["max_connections"] == 100000);
  CHECK(s["hostname"].is_string());
  CHECK_FALSE(s["hostname"].get<std::string>().empty());
  CHECK(s["pid"].get<long>() > 0);
  const auto& u = s["upstreams"][0];
  CHECK(u["servers_available"] == 1);
  CHECK(u["unavailable"] == nlohmann::json{{"drained", 1}});
  CHECK(u["retired"] == nlohmann::json::array());
  CHECK(u["servers"][0]["source"] == "file");
  CHECK(s["removed_upstreams"] == nlohmann::json::array());
  CHECK(server_source("db.internal") == "dns");
  CHECK(server_source("sentinel mymaster") == "sentinel");
  CHECK(server_source("") == "file");

  up->server(1).set_active(ActiveState::down, "connection refused");
  s = status_json(*f.snapshot, f.info, Clock::now(), 3500);
  CHECK(s["upstreams"][0]["servers_available"] == 0);
  CHECK(s["upstreams"][0]["unavailable"] == nlohmann::json{{"down", 1}, {"drained", 1}});
  const std::string m = metrics_text(*f.snapshot, f.info, Clock::now());
  CHECK(m.find("# TYPE sluice_upstream_servers_available gauge\n") != std::string::npos);
  CHECK(m.find("sluice_upstream_servers_available{upstream=\"pg\"} 0\n") != std::string::npos);
}

TEST_CASE("a retired server: in /status, /metrics, the CSV and the page; closed by POST .../retired/ADDR/close") {
  Fixture f;
  AdminApi api(f.hooks());
  std::shared_ptr<ServerState> gone = f.snapshot->find_upstream("pg")->member(0).state;
  std::shared_ptr<const Snapshot> old = f.snapshot;
  f.snapshot = Snapshot::build(
      std::make_shared<const Config>(parse_config(
          "[global]\naccess_log = \"off\"\n[[listener]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\n"
          "upstream = \"pg\"\n[upstream.pg]\nservers = [{ address = \"[::1]:5002\", weight = 3 }]\n",
          "t.toml")),
      f.registry, 2);
  f.registry.retire("pg", gone);
  gone->active = 2;
  gone->bytes_in = 4096;

  nlohmann::json s = nlohmann::json::parse(api.handle(request("GET", "/status")).body);
  const auto& r = s["upstreams"][0]["retired"];
  REQUIRE(r.size() == 1);
  CHECK(r[0]["address"] == "127.0.0.1:5001");
  CHECK(r[0]["sessions"] == 2);
  CHECK(r[0]["bytes_in"] == 4096);
  CHECK(r[0]["age_seconds"].get<double>() >= 0);

  const nlohmann::json one = nlohmann::json::parse(api.handle(request("GET", "/upstreams/pg")).body);
  REQUIRE(one["retired"].size() == 1);
  CHECK(one["retired"][0]["address"] == "127.0.0.1:5001");
  CHECK(one["retired"][0]["sessions"] == 2);
  const std::string m = api.handle(request("GET", "/metrics")).body;
  CHECK(m.find("sluice_upstream_retired_sessions{upstream=\"pg\",server=\"127.0.0.1:5001\"} 2\n") !=
        std::string::npos);
  const auto rows = read_csv(api.handle(request("GET", "/status.csv")).body);
  CHECK(csv_row(rows, "retired", "address", "127.0.0.1:5001")["active"] == "2");
  const std::string page = api.handle(request("GET", "/")).body;
  CHECK(page.find("data-retired=\"127.0.0.1:5001\"") != std::string::npos);
  CHECK(page.find("data-action=\"close\"") != std::string::npos);

  // Its old actions point the way; close takes either spelling.
  Response no = api.handle(request("POST", "/upstreams/pg/servers/127.0.0.1:5001/disable"));
  CHECK(no.status == 404);
  CHECK(no.body.find("retired/127.0.0.1:5001/close") != std::string::npos);
  CHECK(api.handle(request("POST", "/upstreams/pg/retired/127.0.0.1:5001/open")).status == 404);
  CHECK(api.handle(request("GET", "/upstreams/pg/retired/127.0.0.1:5001/close")).status == 405);
  CHECK(api.handle(request("POST", "/upstreams/other/retired/127.0.0.1:5001/close")).status == 404);
  CHECK(api.handle(request("POST", "/upstreams/pg/retired/[::1]:5002/close")).status == 404);  // not retired
  const Response ok = api.handle(request("POST", "/upstreams/pg/retired/127.0.0.1%3A5001/close"));
  CHECK(ok.status == 200);
  CHECK(nlohmann::json::parse(ok.body)["closing"] == 2);
  REQUIRE(f.closed.size() == 1);
  CHECK(f.closed[0] == std::make_pair(std::string("127.0.0.1:5001"), Cause::admin));
  gone->active = 0;
  CHECK(api.handle(request("POST", "/upstreams/pg/retired/127.0.0.1:5001/close")).status == 404);
}

TEST_CASE("/status.csv: a header, RFC 4180 quoting, CRLF, and no cell a spreadsheet would run") {
  Fixture f;
  AdminApi api(f.hooks());
  const Response r = api.handle(request("GET", "/status.csv"));
  CHECK(r.status == 200);
  CHECK(r.content_type.rfind("text/csv", 0) == 0);
  CHECK(r.body.find("\r\n") != std::string::npos);
  const auto rows = read_csv(r.body);
  REQUIRE(rows.size() == 1 + 1 + 1 + 2);  // header, the listener, the upstream, its two servers
  CHECK(rows[0][0] == "type");
  CHECK(csv_row(rows, "listener", "name", "front")["target"] == "pg");
  CHECK(csv_row(rows, "upstream", "name", "pg")["servers_available"] == "2");
  CHECK(csv_row(rows, "server", "address", "[::1]:5002")["weight"] == "3");

  // What a peer or the file controls, hostile: quoted and neutralised.
  nlohmann::json doc = status_json(*f.snapshot, f.info, Clock::now(), 3500);
  doc["upstreams"][0]["servers"][0]["reason"] = "=HYPERLINK(\"http://x\",\"a, b\")";
  doc["upstreams"][0]["servers"][1]["reason"] = "-2+3\r\nnext";
  doc["upstreams"][0]["servers"][1]["from"] = "@SUM(A1)";
  doc["upstreams"][0]["name"] = "+pg";
  const std::string text = status_csv(doc);
  CHECK(text.find("\"'=HYPERLINK(\"\"http://x\"\",\"\"a, b\"\")\"") != std::string::npos);
  const auto hostile = read_csv(text);
  CHECK(csv_row(hostile, "server", "address", "127.0.0.1:5001")["reason"] == "'=HYPERLINK(\"http://x\",\"a, b\")");
  auto b = csv_row(hostile, "server", "address", "[::1]:5002");
  CHECK(b["reason"] == "'-2+3\r\nnext");
  CHECK(b["from"] == "'@SUM(A1)");
  CHECK(b["name"] == "'+pg");
  CHECK(csv_row(hostile, "upstream", "name", "'+pg")["type"] == "upstream");
}

TEST_CASE("the page: a summary row per upstream, roles in words, where servers came from, a red listener") {
  Fixture f;
  f.snapshot = Snapshot::build(
      std::make_shared<const Config>(parse_config(
          "[global]\naccess_log = \"off\"\n[[listener]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\n"
          "upstream = \"pg\"\n[upstream.pg]\nfallback = \"spare\"\nservers = [{ address = \"127.0.0.1:5001\" }, "
          "{ address = \"[::1]:5002\", weight = 1000 }]\n[upstream.spare]\nservers = [{ address = \"127.0.0.1:6001\" "
          "}]\n",
          "t.toml")),
      f.registry, 1);
  const std::int64_t now = wall_ms();
  nlohmann::json doc = status_json(*f.snapshot, f.info, Clock::now(), now);
  auto& servers = doc["upstreams"][0]["servers"];
  servers[0]["role"] = "replica";
  servers[0]["lag_seconds"] = 0;
  servers[0]["from"] = "db.internal";
  servers[1]["role"] = "primary";
  servers[1]["lag_seconds"] = nullptr;
  servers[1]["from"] = "sentinel mymaster";
  std::string page = status_page(doc, now);
  CHECK(page.find("replica, 0 s behind") != std::string::npos);
  CHECK(page.find("<div class=\"sub role\">primary</div>") != std::string::npos);
  CHECK(page.find("DNS db.internal:5001") != std::string::npos);
  CHECK(page.find("sentinel mymaster") != std::string::npos);
  CHECK(page.find(">1000") != std::string::npos);
  CHECK(page.find("data-summary=\"pg\"") != std::string::npos);
  CHECK(page.find("2 up of 2") != std::string::npos);
  CHECK(page.find("fallback &rarr; spare: 0 taken") != std::string::npos);
  CHECK(page.find("id=\"hide-down\"") != std::string::npos);
  CHECK(page.find("href=\"status.csv\"") != std::string::npos);
  CHECK(page.find("id=\"max-connections\">100000<") != std::string::npos);
  CHECK(page.find("class=\"no-server\"") == std::string::npos);

  // pg has no server left: its listener turns red, and says where its sessions go.
  f.snapshot->find_upstream("pg")->server(0).set_admin(AdminState::drain);
  f.snapshot->find_upstream("pg")->server(1).set_active(ActiveState::down, "refused");
  doc = status_json(*f.snapshot, f.info, Clock::now(), now);
  page = status_page(doc, now);
  const std::size_t row = page.find("data-listener=\"front\"");
  REQUIRE(row != std::string::npos);
  CHECK(page.rfind("<tr class=\"no-server\"", row) != std::string::npos);
  CHECK(page.find("fallback spare takes its sessions") != std::string::npos);
  CHECK(page.find("1 down, 1 drained of 2") != std::string::npos);
  CHECK(page.find("0 available") != std::string::npos);
}
