// ClientHello parser: captured hellos from real clients (tests/data/), fed in
// every way TCP may deliver them, plus hand-built hellos for the edge cases
// real clients here never send (GREASE, ECH, broken lengths).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "preread/client_hello.hpp"
#include "sluice/host.hpp"

using sluice::preread::ClientHelloInfo;
using sluice::preread::ClientHelloParser;
using sluice::normalize_host;
using sluice::preread::Status;

namespace {

using Bytes = std::vector<std::uint8_t>;
using Strings = std::vector<std::string>;

// ---------------------------------------------------------------- helpers

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path << " (tests run from the project root)");
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

Bytes bytes_of(std::string_view s) { return Bytes(s.begin(), s.end()); }

void put16(Bytes& out, std::size_t v) {
  out.push_back(static_cast<std::uint8_t>(v >> 8));
  out.push_back(static_cast<std::uint8_t>(v));
}

void put24(Bytes& out, std::size_t v) {
  out.push_back(static_cast<std::uint8_t>(v >> 16));
  put16(out, v);
}

void append(Bytes& out, const Bytes& more) { out.insert(out.end(), more.begin(), more.end()); }

// Feeds `data` in one call.
Status feed_whole(ClientHelloParser& p, const Bytes& data) { return p.feed(data); }

// Feeds `data` one byte per call; every call before the last must answer
// need_more unless the parser has already decided.
Status feed_bytewise(ClientHelloParser& p, const Bytes& data) {
  Status s = p.status();
  for (std::uint8_t b : data) s = p.feed(std::span<const std::uint8_t>(&b, 1));
  return s;
}

// Feeds `data` in chunks of 1..max_chunk bytes chosen by a seeded generator
// (std::mt19937 output is fixed by the standard, so the splits are the same
// everywhere).
Status feed_random(ClientHelloParser& p, const Bytes& data, std::uint32_t seed,
                   std::size_t max_chunk = 64) {
  std::mt19937 rng(seed);
  Status s = p.status();
  std::size_t pos = 0;
  while (pos < data.size()) {
    const std::size_t n = std::min<std::size_t>(1 + rng() % max_chunk, data.size() - pos);
    s = p.feed(std::span<const std::uint8_t>(data.data() + pos, n));
    pos += n;
  }
  return s;
}

// Handshake message bytes of a framed hello (record headers removed).
Bytes handshake_of(const Bytes& framed) {
  Bytes hs;
  std::size_t pos = 0;
  while (pos + 5 <= framed.size()) {
    const std::size_t len = (std::size_t{framed[pos + 3]} << 8) | framed[pos + 4];
    hs.insert(hs.end(), framed.begin() + static_cast<std::ptrdiff_t>(pos + 5),
              framed.begin() + static_cast<std::ptrdiff_t>(pos + 5 + len));
    pos += 5 + len;
  }
  return hs;
}

// Frames a handshake message into records of at most `size` bytes.
Bytes frame(const Bytes& hs, std::size_t size, std::uint16_t version = 0x0301) {
  Bytes out;
  for (std::size_t pos = 0; pos < hs.size(); pos += size) {
    const std::size_t n = std::min(size, hs.size() - pos);
    out.push_back(22);
    put16(out, version);
    put16(out, n);
    out.insert(out.end(), hs.begin() + static_cast<std::ptrdiff_t>(pos),
               hs.begin() + static_cast<std::ptrdiff_t>(pos + n));
  }
  return out;
}

// ------------------------------------------------------ hand-built hellos

struct Ext {
  std::uint16_t type;
  Bytes body;
};

// A server_name extension around a raw ServerNameList (entries as given).
Ext server_name_ext(const Bytes& list) {
  Bytes body;
  put16(body, list.size());
  append(body, list);
  return {0, body};
}

Ext sni_ext(std::string_view host) {
  Bytes entry{0};  // host_name
  put16(entry, host.size());
  append(entry, bytes_of(host));
  return server_name_ext(entry);
}

Ext alpn_ext(const Strings& protos) {
  Bytes list;
  for (const auto& p : protos) {
    list.push_back(static_cast<std::uint8_t>(p.size()));
    append(list, bytes_of(p));
  }
  Bytes body;
  put16(body, list.size());
  append(body, list);
  return {16, body};
}

struct HelloSpec {
  std::uint16_t version = 0x0303;
  Bytes session_id = Bytes(32, 0x55);
  std::vector<std::uint16_t> ciphers = {0x1301, 0x1302, 0xc02f};
  Bytes raw_ciphers;  // when not empty, sent instead of `ciphers` (odd lengths)
  Bytes compression = {0};
  bool with_extensions = true;
  std::vector<Ext> exts;
};

// The ClientHello handshake message (header included), unframed.
Bytes build_handshake(const HelloSpec& s) {
  Bytes body;
  put16(body, s.version);
  for (int i = 0; i < 32; ++i) body.push_back(static_cast<std::uint8_t>(i * 7));
  body.push_back(static_cast<std::uint8_t>(s.session_id.size()));
  append(body, s.session_id);
  if (s.raw_ciphers.empty()) {
    put16(body, s.ciphers.size() * 2);
    for (auto c : s.ciphers) put16(body, c);
  } else {
    put16(body, s.raw_ciphers.size());
    append(body, s.raw_ciphers);
  }
  body.push_back(static_cast<std::uint8_t>(s.compression.size()));
  append(body, s.compression);
  if (s.with_extensions) {
    Bytes exts;
    for (const auto& e : s.exts) {
      put16(exts, e.type);
      put16(exts, e.body.size());
      append(exts, e.body);
    }
    put16(body, exts.size());
    append(body, exts);
  }
  Bytes hs{1};
  put24(hs, body.size());
  append(hs, body);
  return hs;
}

Bytes build_hello(const HelloSpec& s, std::size_t record_size = 16384) {
  return frame(build_handshake(s), record_size);
}

HelloSpec typical_spec(std::string_view host = "svc.example.com") {
  HelloSpec s;
  s.exts = {sni_ext(host), {10, {0, 2, 0, 29}}, alpn_ext({"h2", "http/1.1"}), {43, {2, 3, 4}}};
  return s;
}

Status parse(const Bytes& data, std::size_t max_bytes = 16384) {
  ClientHelloParser p(max_bytes);
  return p.feed(data);
}

// ------------------------------------------------------- captured hellos

struct Capture {
  const char* file;
  bool has_sni;
  const char* sni;
  Strings alpn;
  std::uint16_t client_version;
};

// Must agree with tests/data/README.md.
const std::vector<Capture>& captures() {
  static const std::vector<Capture> list = {
      {"hello_openssl_tls12_sni.bin", true, "tls12.example.com", {}, 0x0303},
      {"hello_openssl_tls12_nosni.bin", false, "", {}, 0x0303},
      {"hello_openssl_tls12_alpn.bin", true, "alpn12.example.com", {"h2", "http/1.1"}, 0x0303},
      {"hello_openssl_tls13_sni.bin", true, "tls13.example.com", {}, 0x0303},
      {"hello_openssl_tls13_nosni.bin", false, "", {}, 0x0303},
      {"hello_openssl_tls13_alpn.bin", true, "alpn13.example.com", {"h2", "http/1.1"}, 0x0303},
      {"hello_openssl_large_keyshare.bin", true, "large.example.com", {"h2", "http/1.1"}, 0x0303},
      {"hello_python_ssl.bin", true, "python.example.net", {"h2", "http/1.1"}, 0x0303},
      {"hello_curl.bin", true, "curl.example.org", {"h2", "http/1.1"}, 0x0303},
      {"hello_curl_http11.bin", true, "h1.curl.example.org", {"http/1.1"}, 0x0303},
      {"hello_multirecord_100.bin", true, "alpn13.example.com", {"h2", "http/1.1"}, 0x0303},
  };
  // Written only where the local openssl offers a post-quantum hybrid group.
  static const std::vector<Capture> with_pq = [] {
    std::vector<Capture> l = list;
    if (std::filesystem::exists("tests/data/hello_openssl_pq.bin")) {
      l.push_back({"hello_openssl_pq.bin", true, "pq.example.com", {}, 0x0303});
    }
    return l;
  }();
  return with_pq;
}

Bytes load_capture(const Capture& c) { return read_file(std::string("tests/data/") + c.file); }

void check_info(const ClientHelloInfo& info, const Capture& c) {
  CHECK(info.has_sni == c.has_sni);
  CHECK(info.sni == c.sni);
  CHECK(info.alpn == c.alpn);
  CHECK(info.client_version == c.client_version);
  CHECK(info.record_version >= 0x0300);
  CHECK(info.record_version <= 0x0304);
}

}  // namespace

// ======================================================================
TEST_SUITE("client_hello captured") {

TEST_CASE("every capture listed in tests/data/ is covered") {
  // A capture added to tests/data/ without an expectation here would
  // silently go untested by the SNI/ALPN checks.
  std::size_t on_disk = 0;
  for (const auto& entry : std::filesystem::directory_iterator("tests/data")) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("hello_") && name.ends_with(".bin")) {
      ++on_disk;
      const bool known = std::any_of(captures().begin(), captures().end(),
                                     [&](const Capture& c) { return name == c.file; });
      CHECK_MESSAGE(known, name << " has no expected SNI/ALPN in this test");
    }
  }
  CHECK(on_disk == captures().size());
}

TEST_CASE("fed whole") {
  for (const auto& c : captures()) {
    CAPTURE(c.file);
    const Bytes data = load_capture(c);
    ClientHelloParser p;
    REQUIRE(feed_whole(p, data) == Status::done);
    CHECK(p.status() == Status::done);
    check_info(p.info(), c);
  }
}

TEST_CASE("fed one byte at a time") {
  for (const auto& c : captures()) {
    CAPTURE(c.file);
    const Bytes data = load_capture(c);
    ClientHelloParser p;
    for (std::size_t i = 0; i + 1 < data.size(); ++i) {
      REQUIRE(p.feed(std::span<const std::uint8_t>(&data[i], 1)) == Status::need_more);
    }
    REQUIRE(p.feed(std::span<const std::uint8_t>(&data.back(), 1)) == Status::done);
    check_info(p.info(), c);
  }
}

TEST_CASE("fed in random splits") {
  for (const auto& c : captures()) {
    CAPTURE(c.file);
    const Bytes data = load_capture(c);
    for (std::uint32_t seed = 1; seed <= 25; ++seed) {
      CAPTURE(seed);
      ClientHelloParser p;
      REQUIRE(feed_random(p, data, seed, 1 + seed * 7) == Status::done);
      check_info(p.info(), c);
    }
  }
}

TEST_CASE("every proper prefix needs more") {
  for (const auto& c : captures()) {
    CAPTURE(c.file);
    const Bytes data = load_capture(c);
    for (std::size_t n = 0; n < data.size(); ++n) {
      CAPTURE(n);
      ClientHelloParser p;
      REQUIRE(p.feed(std::span<const std::uint8_t>(data.data(), n)) == Status::need_more);
      CHECK_FALSE(p.info().has_sni);
    }
  }
}

TEST_CASE("re-framed into records of any size") {
  // 1-byte records put every field, including the 4-byte handshake header,
  // across record boundaries.
  for (const auto& c : captures()) {
    CAPTURE(c.file);
    const Bytes hs = handshake_of(load_capture(c));
    for (std::size_t size : {1U, 2U, 3U, 4U, 5U, 7U, 33U, 100U, 255U, 16384U}) {
      CAPTURE(size);
      const Bytes framed = frame(hs, size, 0x0303);
      ClientHelloParser p(65536);
      REQUIRE(feed_random(p, framed, static_cast<std::uint32_t>(size)) == Status::done);
      check_info(p.info(), c);
      CHECK(p.info().record_version == 0x0303);
    }
  }
}

TEST_CASE("bytes after the hello are left alone") {
  // TLS 1.3 middlebox-compatibility CCS or early data may follow in the same
  // segment; the hello is complete regardless.
  const Capture& c = captures()[5];
  Bytes data = load_capture(c);
  append(data, {20, 3, 3, 0, 1, 1, 23, 3, 3, 0, 2, 0xde, 0xad});
  ClientHelloParser p;
  REQUIRE(p.feed(data) == Status::done);
  check_info(p.info(), c);
}

TEST_CASE("a decided parser keeps its answer") {
  const Capture& c = captures()[5];  // has SNI and ALPN
  const Bytes data = load_capture(c);
  ClientHelloParser p;
  REQUIRE(p.feed(data) == Status::done);
  CHECK(p.feed(bytes_of("GET / HTTP/1.1\r\n")) == Status::done);
  CHECK(p.feed(Bytes(20000, 0x16)) == Status::done);
  check_info(p.info(), c);

  ClientHelloParser q;
  REQUIRE(q.feed(bytes_of("GET")) == Status::not_tls);
  CHECK(q.feed(data) == Status::not_tls);
  CHECK_FALSE(q.info().has_sni);
}

TEST_CASE("max_bytes") {
  const Bytes data = load_capture(captures()[7]);  // curl, 517 bytes
  SUBCASE("a hello of exactly max_bytes is accepted") {
    ClientHelloParser p(data.size());
    CHECK(feed_bytewise(p, data) == Status::done);
  }
  SUBCASE("one byte short of the hello is malformed, not need_more") {
    ClientHelloParser p(data.size() - 1);
    CHECK(p.feed(data) == Status::malformed);
    CHECK(std::string(p.error()).size() > 0);
  }
  SUBCASE("the byte past the cap decides, whatever the split") {
    ClientHelloParser p(data.size() - 1);
    for (std::size_t i = 0; i + 1 < data.size(); ++i) {
      // The handshake length already says the hello cannot fit, so the
      // parser may answer as soon as it sees it; it must never say done.
      const Status s = p.feed(std::span<const std::uint8_t>(&data[i], 1));
      REQUIRE(s != Status::done);
      REQUIRE(s != Status::not_tls);
    }
    CHECK(p.feed(std::span<const std::uint8_t>(&data.back(), 1)) == Status::malformed);
  }
  SUBCASE("a handshake length that cannot fit is refused from its header") {
    // Record header + handshake header announce a 20000-byte hello: no need
    // to wait for 16 KiB to know it will not fit.
    Bytes head{22, 3, 1, 0x40, 0x00, 1};
    put24(head, 20000);
    ClientHelloParser p;
    CHECK(p.feed(head) == Status::malformed);
  }
  SUBCASE("a stream of records that never completes the hello") {
    // Announce a 16000-byte hello, then send 1-byte records forever: the
    // framing overhead makes it exceed the cap before the hello completes.
    Bytes hs{1};
    put24(hs, 16000);
    hs.resize(4 + 16000, 0);
    const Bytes framed = frame(hs, 1);
    ClientHelloParser p;
    CHECK(feed_random(p, framed, 7) == Status::malformed);
  }
  SUBCASE("a large hello over several full records fits a larger cap") {
    HelloSpec s = typical_spec("big.example.com");
    s.exts.push_back({21, Bytes(30000, 0)});  // padding
    const Bytes framed = build_hello(s);
    CHECK(framed.size() > 30000);
    CHECK(parse(framed) == Status::malformed);
    ClientHelloParser p(65536);
    REQUIRE(feed_random(p, framed, 3, 4096) == Status::done);
    CHECK(p.info().sni == "big.example.com");
  }
}

}  // TEST_SUITE

// ======================================================================
TEST_SUITE("client_hello not tls") {

TEST_CASE("other protocols are recognized from their first bytes") {
  struct Case {
    const char* name;
    Bytes data;
  };
  const std::vector<Case> cases = {
      {"HTTP", bytes_of("GET / HTTP/1.1\r\nHost: a\r\n\r\n")},
      {"HTTP, first byte only", bytes_of("G")},
      {"SSH", bytes_of("SSH-2.0-OpenSSH_9.2p1\r\n")},
      {"PostgreSQL SSLRequest", {0x00, 0x00, 0x00, 0x08, 0x04, 0xd2, 0x16, 0x2f}},
      {"PostgreSQL startup",
       {0x00, 0x00, 0x00, 0x17, 0x00, 0x03, 0x00, 0x00, 'u', 's', 'e', 'r', 0x00, 'b', 'o', 'b',
        0x00, 0x00}},
      {"Redis", bytes_of("*1\r\n$4\r\nPING\r\n")},
      {"SSLv2-compatible hello", {0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15}},
      {"handshake type byte with major version 2", {0x16, 0x02, 0x00, 0x00, 0x10}},
      {"handshake type byte with major version 0x47", bytes_of("\x16GET / HTTP/1.1")},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    ClientHelloParser whole;
    CHECK(whole.feed(c.data) == Status::not_tls);
    CHECK(std::string(whole.error()).size() > 0);
    ClientHelloParser bytewise;
    CHECK(feed_bytewise(bytewise, c.data) == Status::not_tls);
    CHECK_FALSE(whole.info().has_sni);
  }
}

TEST_CASE("one byte of 0x16 is not enough to decide") {
  ClientHelloParser p;
  CHECK(p.feed(Bytes{0x16}) == Status::need_more);
  CHECK(p.feed(Bytes{}) == Status::need_more);
  CHECK(p.feed(Bytes{0x03}) == Status::need_more);
}

}  // TEST_SUITE

// ======================================================================
TEST_SUITE("client_hello hand-built") {

TEST_CASE("a typical hello") {
  const Bytes data = build_hello(typical_spec());
  ClientHelloParser p;
  REQUIRE(p.feed(data) == Status::done);
  CHECK(p.info().sni == "svc.example.com");
  CHECK(p.info().alpn == Strings{"h2", "http/1.1"});
  CHECK(p.info().record_version == 0x0301);
  CHECK(p.info().client_version == 0x0303);
}

TEST_CASE("GREASE in ciphers, extensions and ALPN is tolerated") {
  HelloSpec s;
  s.ciphers = {0x3a3a, 0x1301, 0x1302};
  const std::string grease_proto("\x5a\x5a", 2);
  s.exts = {{0x0a0a, {}},
            sni_ext("grease.example.com"),
            {0x1a1a, {0}},
            alpn_ext({grease_proto, "h2"}),
            {10, {0, 4, 0xca, 0xca, 0, 29}},  // GREASE group
            {0xfafa, {}}};
  ClientHelloParser p;
  REQUIRE(feed_random(p, build_hello(s), 11, 9) == Status::done);
  CHECK(p.info().sni == "grease.example.com");
  CHECK(p.info().alpn == Strings{grease_proto, "h2"});
}

TEST_CASE("ECH outer hello routes on its outer server_name") {
  HelloSpec s = typical_spec("public.example.com");
  Bytes ech{0};  // ECHClientHello type outer, then opaque config id / enc / payload
  for (int i = 0; i < 200; ++i) ech.push_back(static_cast<std::uint8_t>(i));
  s.exts.push_back({0xfe0d, ech});
  ClientHelloParser p;
  REQUIRE(p.feed(build_hello(s)) == Status::done);
  CHECK(p.info().sni == "public.example.com");
}

TEST_CASE("a hello without an extensions block") {
  HelloSpec s;
  s.version = 0x0301;
  s.with_extensions = false;
  ClientHelloParser p;
  REQUIRE(p.feed(build_hello(s)) == Status::done);
  CHECK_FALSE(p.info().has_sni);
  CHECK(p.info().alpn.empty());
  CHECK(p.info().client_version == 0x0301);
}

TEST_CASE("an empty extensions block") {
  HelloSpec s;
  ClientHelloParser p;
  REQUIRE(p.feed(build_hello(s)) == Status::done);
  CHECK_FALSE(p.info().has_sni);
}

TEST_CASE("server_name entries") {
  SUBCASE("another name type before the host name is skipped") {
    HelloSpec s;
    s.exts = {server_name_ext({7, 0, 3, 'x', 'y', 'z', 0, 0, 5, 'a', '.', 'b', '.', 'c'})};
    ClientHelloParser p;
    REQUIRE(p.feed(build_hello(s)) == Status::done);
    CHECK(p.info().sni == "a.b.c");
  }
  SUBCASE("the first of two host names is taken") {
    HelloSpec s;
    s.exts = {server_name_ext({0, 0, 3, 'o', 'n', 'e', 0, 0, 3, 't', 'w', 'o'})};
    ClientHelloParser p;
    REQUIRE(p.feed(build_hello(s)) == Status::done);
    CHECK(p.info().sni == "one");
  }
  SUBCASE("case, trailing dot, underscore and digits are kept as sent") {
    HelloSpec s = typical_spec("My_Host-01.Example.COM.");
    ClientHelloParser p;
    REQUIRE(p.feed(build_hello(s)) == Status::done);
    CHECK(p.info().sni == "My_Host-01.Example.COM.");
  }
  SUBCASE("a 255-byte host name is accepted") {
    const std::string host(255, 'a');
    ClientHelloParser p;
    REQUIRE(p.feed(build_hello(typical_spec(host))) == Status::done);
    CHECK(p.info().sni == host);
  }
}

TEST_CASE("malformed hand-built hellos") {
  struct Case {
    const char* name;
    Bytes data;
  };
  std::vector<Case> cases;
  auto add = [&](const char* name, const HelloSpec& s) { cases.push_back({name, build_hello(s)}); };
  // Replaces the extension of the same type in a typical hello (so that the
  // broken extension is the only defect), or appends it.
  auto add_ext = [&](const char* name, Ext e) {
    HelloSpec s = typical_spec();
    auto same = std::find_if(s.exts.begin(), s.exts.end(),
                             [&](const Ext& x) { return x.type == e.type; });
    if (same != s.exts.end()) {
      *same = std::move(e);
    } else {
      s.exts.push_back(std::move(e));
    }
    add(name, s);
  };
  auto add_dup = [&](const char* name, Ext e) {
    HelloSpec s = typical_spec();
    s.exts.push_back(std::move(e));
    add(name, s);
  };

  {
    HelloSpec s = typical_spec();
    s.session_id = Bytes(33, 1);
    add("session_id longer than 32", s);
  }
  {
    HelloSpec s = typical_spec();
    s.ciphers.clear();
    add("no cipher suites", s);
  }
  {
    HelloSpec s = typical_spec();
    s.compression.clear();
    add("no compression methods", s);
  }
  {
    HelloSpec s = typical_spec();
    s.raw_ciphers = {0x13, 0x01, 0x13};
    add("odd cipher_suites length", s);
  }
  {
    HelloSpec s = typical_spec();
    s.version = 0x0203;
    add("client version major 2", s);
  }
  add("empty host name", typical_spec(""));
  add("256-byte host name", typical_spec(std::string(256, 'a')));
  add("space in host name", typical_spec("a b.example.com"));
  add("star in host name", typical_spec("*.example.com"));
  add("slash in host name", typical_spec("a/b.example.com"));
  add("NUL in host name", typical_spec(std::string("a\0b.example.com", 15)));
  add("byte 0x80 in host name", typical_spec("a\x80.example.com"));
  add("byte 0x7f in host name", typical_spec("a\x7f.example.com"));
  add_dup("duplicate server_name", sni_ext("other.example.com"));
  add_dup("duplicate ALPN", alpn_ext({"h2"}));
  add_dup("duplicate unknown extension", {43, {2, 3, 3}});
  add_ext("ALPN with an empty protocol name", alpn_ext({"h2", ""}));
  add_ext("ALPN with an empty list", {16, {0, 0}});
  add_ext("ALPN list length longer than the extension", {16, {0, 5, 2, 'h', '2'}});
  add_ext("ALPN list length shorter than the extension", {16, {0, 2, 2, 'h', '2'}});
  add_ext("ALPN name overrunning the list", {16, {0, 3, 3, 'h', '2'}});
  add_ext("ALPN extension without a list", {16, {}});
  add_ext("server_name list length mismatch", {0, {0, 9, 0, 0, 3, 'a', '.', 'b'}});
  add_ext("server_name entry overruns", {0, {0, 6, 0, 0, 4, 'a', '.', 'b'}});
  add_ext("server_name empty list", {0, {0, 0}});
  add_ext("server_name without a list", {0, {}});
  {
    HelloSpec s = typical_spec();
    s.exts.push_back({0x0a0a, {}});
    s.exts.push_back({0x0a0a, {}});
    add("two GREASE extensions of the same value", s);
  }

  for (const auto& c : cases) {
    CAPTURE(c.name);
    ClientHelloParser whole;
    CHECK(whole.feed(c.data) == Status::malformed);
    CHECK(std::string(whole.error()).size() > 0);
    CHECK_FALSE(whole.info().has_sni);
    ClientHelloParser bytewise;
    CHECK(feed_bytewise(bytewise, c.data) == Status::malformed);
  }
}

TEST_CASE("malformed lengths in the framing and the message") {
  const Bytes good_hs = build_handshake(typical_spec());
  const Bytes good = frame(good_hs, 16384);
  REQUIRE(parse(good) == Status::done);
  // Offsets inside `good`: record header 0..4, handshake header 5..8,
  // legacy_version 9..10, random 11..42, session_id length 43.
  const std::size_t sid_len = 43;
  const std::size_t cs_len = sid_len + 1 + 32;
  const std::size_t comp_len = cs_len + 2 + 6;
  const std::size_t ext_len = comp_len + 2;

  auto with = [&](std::size_t pos, std::initializer_list<std::uint8_t> v) {
    Bytes b = good;
    for (std::uint8_t x : v) b.at(pos++) = x;
    return b;
  };
  REQUIRE(good[cs_len + 1] == 6);
  REQUIRE(good[comp_len] == 1);

  struct Case {
    const char* name;
    Bytes data;
  };
  const std::vector<Case> cases = {
      {"record minor version 5", with(2, {5})},
      {"record length 0", with(3, {0, 0})},
      {"record length above 2^14", with(3, {0x40, 0x01})},
      {"handshake type 2 (ServerHello)", with(5, {2})},
      {"handshake type 0", with(5, {0})},
      {"handshake length below the smallest hello", with(6, {0, 0, 10})},
      {"session_id length 33", with(sid_len, {33})},
      {"session_id length past the message", with(sid_len, {0xff})},
      {"odd cipher_suites length", with(cs_len, {0, 5})},
      {"cipher_suites length 0", with(cs_len, {0, 0})},
      {"cipher_suites past the message", with(cs_len, {0xff, 0xfe})},
      {"compression length 0", with(comp_len, {0})},
      {"compression past the message", with(comp_len, {0xff})},
      {"extensions length one too long", with(ext_len, {good[ext_len], static_cast<std::uint8_t>(good[ext_len + 1] + 1)})},
      {"extensions length one too short", with(ext_len, {good[ext_len], static_cast<std::uint8_t>(good[ext_len + 1] - 1)})},
      {"first extension overruns the block", with(ext_len + 4, {0xff, 0xff})},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CHECK(parse(c.data) == Status::malformed);
    ClientHelloParser bytewise;
    CHECK(feed_bytewise(bytewise, c.data) == Status::malformed);
  }

  SUBCASE("handshake length longer than the data waits for more") {
    // Not malformed yet: another record could carry the rest.
    Bytes b = with(6, {0, 0x10, 0});
    CHECK(parse(b) == Status::need_more);
  }
  SUBCASE("trailing bytes inside the hello after its extensions") {
    Bytes hs = good_hs;
    hs.push_back(0);
    const std::size_t body = hs.size() - 4;
    hs[1] = static_cast<std::uint8_t>(body >> 16);
    hs[2] = static_cast<std::uint8_t>(body >> 8);
    hs[3] = static_cast<std::uint8_t>(body);
    CHECK(parse(frame(hs, 16384)) == Status::malformed);
  }
}

TEST_CASE("non-handshake records before the hello is complete") {
  const Bytes hs = build_handshake(typical_spec());
  const Bytes first = frame(Bytes(hs.begin(), hs.begin() + 50), 16384);
  const Bytes rest = frame(Bytes(hs.begin() + 50, hs.end()), 16384);
  REQUIRE(parse([&] { Bytes b = first; append(b, rest); return b; }()) == Status::done);

  struct Case {
    const char* name;
    Bytes record;
  };
  const std::vector<Case> cases = {
      {"alert", {21, 3, 3, 0, 2, 2, 40}},
      {"change_cipher_spec", {20, 3, 3, 0, 1, 1}},
      {"application_data", {23, 3, 3, 0, 3, 1, 2, 3}},
      {"unknown content type", {99, 3, 3, 0, 1, 0}},
      {"handshake record with major version 2", {22, 2, 0, 0, 1, 0}},
      {"empty handshake record", {22, 3, 3, 0, 0}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    Bytes b = first;
    append(b, c.record);
    append(b, rest);
    ClientHelloParser p;
    CHECK(p.feed(b) == Status::malformed);
    ClientHelloParser q;
    CHECK(feed_bytewise(q, b) == Status::malformed);
  }

  SUBCASE("an alert as the very first record is not TLS handshake traffic") {
    CHECK(parse({21, 3, 3, 0, 2, 2, 40}) == Status::not_tls);
  }
}

}  // TEST_SUITE

// ======================================================================
TEST_SUITE("client_hello corruption") {

TEST_CASE("specific corruptions of a captured hello") {
  const Bytes good = load_capture(captures()[1]);  // TLS 1.2, no SNI
  REQUIRE(parse(good) == Status::done);
  auto with = [&](std::size_t pos, std::uint8_t v) {
    Bytes b = good;
    b[pos] = v;
    return b;
  };
  CHECK(parse(with(0, 0x17)) == Status::not_tls);   // application_data
  CHECK(parse(with(1, 0x02)) == Status::not_tls);   // SSL 2 record version
  CHECK(parse(with(2, 0x09)) == Status::malformed); // record version 3.9
  CHECK(parse(with(3, 0x50)) == Status::malformed); // record length > 2^14
  CHECK(parse(with(5, 0x02)) == Status::malformed); // ServerHello
  CHECK(parse(with(6, 0x01)) == Status::malformed); // handshake length > 64 KiB, cannot fit
  CHECK(parse(with(9, 0x04)) == Status::malformed); // legacy_version 4.x
  CHECK(parse(with(43, 0x21)) == Status::malformed); // session_id length 33
  // Shorter record and handshake lengths cut the message: what is left
  // no longer adds up.
  {
    Bytes b = good;
    b[4] = static_cast<std::uint8_t>(b[4] - 1);
    b[8] = static_cast<std::uint8_t>(b[8] - 1);
    CHECK(parse(b) == Status::malformed);
  }
}

TEST_CASE("no single-byte corruption anywhere crashes or depends on the split") {
  // Run under -Db_sanitize=address,undefined for the memory-safety half.
  for (const auto& c : captures()) {
    CAPTURE(c.file);
    const Bytes good = load_capture(c);
    std::size_t done = 0;
    std::size_t bad = 0;
    for (std::size_t pos = 0; pos < good.size(); ++pos) {
      for (int k = 0; k < 5; ++k) {
        Bytes b = good;
        switch (k) {
          case 0: b[pos] ^= 0x01; break;
          case 1: b[pos] ^= 0x80; break;
          case 2: b[pos] ^= 0xff; break;
          case 3: b[pos] = 0x00; break;
          default: b[pos] = static_cast<std::uint8_t>(b[pos] + 1); break;
        }
        if (b == good) continue;
        ClientHelloParser whole;
        const Status s = whole.feed(b);
        ClientHelloParser split;
        const Status t = feed_random(split, b, static_cast<std::uint32_t>(pos * 5 + static_cast<std::size_t>(k)), 16);
        if (s != t) {
          FAIL_CHECK("whole and split disagree at byte " << pos << " variant " << k);
        }
        if (s == Status::done) {
          ++done;
          const auto& info = whole.info();
          if (info.has_sni != split.info().has_sni || info.sni != split.info().sni ||
              info.alpn != split.info().alpn) {
            FAIL_CHECK("whole and split info differ at byte " << pos);
          }
          if (info.has_sni && (info.sni.empty() || info.sni.size() > 255)) {
            FAIL_CHECK("accepted a bad host name at byte " << pos);
          }
        } else if (s == Status::malformed || s == Status::not_tls) {
          ++bad;
        }
      }
    }
    // Random/session bytes change freely, length bytes must not.
    CHECK(done > 0);
    CHECK(bad > 0);
  }
}

}  // TEST_SUITE

// ======================================================================
TEST_CASE("normalize_host") {
  CHECK(normalize_host("Example.COM") == "example.com");
  CHECK(normalize_host("example.com.") == "example.com");
  CHECK(normalize_host("example.com..") == "example.com.");
  CHECK(normalize_host(".") == "");
  CHECK(normalize_host("") == "");
  CHECK(normalize_host("A-B_C.0-9.Z") == "a-b_c.0-9.z");
  CHECK(normalize_host("\xc3\x89") == "\xc3\x89");  // non-ASCII bytes untouched
}
