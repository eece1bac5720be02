// Cache archives (include/mlajit/cache_archive.hpp) and `mlajit cache export|import`: a round trip
// keeps every byte; a tampered, truncated or wrongly signed archive is refused whole.
#include "shell_command.hpp"
#include "temp_dir.hpp"
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "core/sha256.hpp"
#include "mlajit/cache_archive.hpp"
#include "mlajit/compiler.hpp"
#include "mlajit/error.hpp"

using namespace mlajit;
namespace fs = std::filesystem;
using mlajit::testing::TempDir;

namespace {

ArchiveEntry make_entry(int i, const std::string& arch) {
  ArchiveEntry e;
  e.key = sha256_hex("archive entry " + std::to_string(i));
  e.entry.key = e.key;
  e.entry.meta.name = "archived_" + std::to_string(i);
  e.entry.meta.op = "sparse_index_remap";
  e.entry.meta.params_json = R"({"page_size":64})";
  e.entry.meta.entries = {{"mj_entry", 256, 0}};
  e.entry.meta.arch = arch;
  e.entry.meta.nvrtc_version = "13.0 (test)";
  e.entry.cubin = std::string("\x7f" "ELF", 4) + std::string(1000 + i, static_cast<char>('a' + i));
  return e;
}

std::vector<ArchiveEntry> sample() { return {make_entry(1, "sm_90a"), make_entry(2, "sm_100a"), make_entry(3, "sm_90a")}; }

const std::string kKey = "0123456789abcdef0123456789abcdef";

std::string refusal(const std::string& data, const std::string& key = "", bool allow_unsigned = false) {
  try {
    unpack_cache_archive(data, key, allow_unsigned);
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Cache);
    return e.what();
  }
  return "";
}

using Out = mlajit::testing::ShellOutput;

Out sh(const std::string& command) { return mlajit::testing::run_shell(command + " 2>&1"); }

using mlajit::testing::read_file;

void spit(const fs::path& p, const std::string& data) { std::ofstream(p, std::ios::binary) << data; }

size_t entries_in(const fs::path& dir) {
  size_t n = 0;
  if (!fs::exists(dir)) return 0;
  for (auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".mjc";
  return n;
}

}  // namespace

TEST_CASE("archive: a round trip returns every entry, byte for byte, in order") {
  const auto in = sample();
  const std::string data = pack_cache_archive(in, "");
  auto out = unpack_cache_archive(data, "", false);
  CHECK_FALSE(out.is_signed);
  REQUIRE(out.entries.size() == in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    CHECK(out.entries[i].key == in[i].key);
    CHECK(out.entries[i].entry.cubin == in[i].entry.cubin);
    CHECK(out.entries[i].entry.meta.arch == in[i].entry.meta.arch);
    CHECK(out.entries[i].entry.meta.name == in[i].entry.meta.name);
  }
  CHECK(unpack_cache_archive(pack_cache_archive({}, ""), "", false).entries.empty());
}

TEST_CASE("archive: any changed byte is refused") {
  const std::string data = pack_cache_archive(sample(), "");
  // Every byte of a small archive: header, manifest, each entry's header, metadata and cubin.
  size_t refused = 0;
  for (size_t i = 0; i < data.size(); i += (i < 600 ? 1 : 97)) {
    std::string bad = data;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    std::string why = refusal(bad);
    if (!why.empty()) ++refused;
    else FAIL_CHECK("byte " << i << " changed and the archive was accepted");
  }
  CHECK(refused > 100);
  std::string last = data;
  last.back() = static_cast<char>(last.back() ^ 1);
  std::string why = refusal(last);
  CHECK(why.find("SHA-256 mismatch") != std::string::npos);
  CHECK(why.find("nothing was imported") != std::string::npos);
}

TEST_CASE("archive: a truncated archive, or one with bytes after its last entry, is refused") {
  const std::string data = pack_cache_archive(sample(), kKey);
  for (size_t len : {size_t{0}, size_t{7}, size_t{19}, size_t{51}, size_t{52}, size_t{100}, data.size() / 2, data.size() - 1}) {
    CAPTURE(len);
    std::string why = refusal(data.substr(0, len), kKey);
    CHECK_FALSE(why.empty());
  }
  CHECK(refusal(data.substr(0, data.size() - 1), kKey).find("truncated") != std::string::npos);
  CHECK(refusal(data + "x", kKey).find("after the last entry") != std::string::npos);
}

TEST_CASE("archive: signatures: verified with the key, refused with another key or unsigned, unchecked without a key") {
  const std::string signed_data = pack_cache_archive(sample(), kKey);
  auto ok = unpack_cache_archive(signed_data, kKey, false);
  CHECK(ok.is_signed);
  CHECK(ok.signature_verified);
  CHECK(refusal(signed_data, "another key, also 32 bytes long!").find("signature does not verify") != std::string::npos);

  const std::string unsigned_data = pack_cache_archive(sample(), "");
  CHECK(refusal(unsigned_data, kKey).find("--allow-unsigned") != std::string::npos);
  auto allowed = unpack_cache_archive(unsigned_data, kKey, /*allow_unsigned=*/true);
  CHECK_FALSE(allowed.is_signed);
  CHECK(allowed.entries.size() == 3);

  auto unchecked = unpack_cache_archive(signed_data, "", false);
  CHECK(unchecked.is_signed);
  CHECK_FALSE(unchecked.signature_verified);
}

TEST_CASE("cli: cache export then import: round trip, --arch lists other archs, bad archives write nothing") {
  if (!Compiler::available()) {
    MESSAGE("NVRTC unavailable: export cannot build; skipped");
    return;
  }
  TempDir t("archive_cli");
  const std::string cli = MLAJIT_CLI_PATH;
  const fs::path cfg = t.path / "k.json", archive = t.path / "k.mlajit", src = t.path / "src";
  spit(cfg, R"({"kernels": [{"op": "sparse_index_remap", "params": {"page_size": 64}}]})");
  const std::string env = "MLAJIT_CACHE_PATH= MLAJIT_REMOTE_CACHE_KEY_FILE= ";

  Out ex = sh(env + cli + " cache export " + cfg.string() + " -o " + archive.string() +
              " --arch sm_90a,sm_100a --json --cache-dir " + src.string());
  REQUIRE_MESSAGE(ex.code == 0, ex.text);
  auto ej = nlohmann::json::parse(ex.text.substr(ex.text.find('{')));
  CHECK(ej["entries"].size() == 2);
  CHECK(ej["signed"] == false);

  const fs::path dst = t.path / "dst";
  Out im = sh(env + cli + " cache import " + archive.string() + " --json --cache-dir " + dst.string());
  REQUIRE_MESSAGE(im.code == 0, im.text);
  auto ij = nlohmann::json::parse(im.text.substr(im.text.find('{')));
  CHECK(ij["imported"].size() == 2);
  CHECK(entries_in(dst) == 2);
  for (auto& e : fs::directory_iterator(src))  // the same bytes as the cache they came from
    if (e.path().extension() == ".mjc") CHECK(read_file(e.path()) == read_file(dst / e.path().filename()));
  Out again = sh(env + cli + " cache import " + archive.string() + " --json --cache-dir " + dst.string());
  CHECK(nlohmann::json::parse(again.text.substr(again.text.find('{')))["already_present"].size() == 2);

  // Only sm_90a wanted: the sm_100a entry is listed, not written.
  const fs::path only90 = t.path / "only90";
  Out sel = sh(env + cli + " cache import " + archive.string() + " --arch sm_90a --json --cache-dir " + only90.string());
  REQUIRE(sel.code == 0);
  auto sj = nlohmann::json::parse(sel.text.substr(sel.text.find('{')));
  CHECK(sj["imported"].size() == 1);
  REQUIRE(sj["other_arch"].size() == 1);
  CHECK(sj["other_arch"][0]["arch"] == "sm_100a");
  CHECK(entries_in(only90) == 1);
  Out text = sh(env + cli + " cache import " + archive.string() + " --arch sm_90a --cache-dir " + (t.path / "t").string());
  CHECK(text.text.find("skipped (built for sm_100a)") != std::string::npos);

  // One changed byte, or a cut-off copy: refused, and the target cache stays empty.
  const std::string good = read_file(archive);
  std::string tampered = good;
  tampered[good.size() - 10] = static_cast<char>(tampered[good.size() - 10] ^ 1);
  spit(t.path / "tampered", tampered);
  spit(t.path / "truncated", good.substr(0, good.size() - 100));
  for (const char* bad : {"tampered", "truncated"}) {
    CAPTURE(bad);
    const fs::path fresh = t.path / (std::string("fresh_") + bad);
    Out r = sh(env + cli + " cache import " + (t.path / bad).string() + " --cache-dir " + fresh.string());
    CHECK(r.code == 4);
    CHECK(r.text.find("refusing the cache archive") != std::string::npos);
    CHECK(entries_in(fresh) == 0);
  }

  // Signed with the key file; another key refuses it.
  const fs::path key = t.path / "key", other = t.path / "other";
  spit(key, "fleet key: 32 bytes of secret....");
  spit(other, "another key: 32 bytes of secret..");
  ::chmod(key.c_str(), 0600);
  ::chmod(other.c_str(), 0600);
  const fs::path signed_archive = t.path / "signed.mlajit";
  Out sx = sh("MLAJIT_CACHE_PATH= MLAJIT_REMOTE_CACHE_KEY_FILE=" + key.string() + " " + cli + " cache export " +
              cfg.string() + " -o " + signed_archive.string() + " --arch sm_90a --cache-dir " + src.string());
  REQUIRE_MESSAGE(sx.code == 0, sx.text);
  CHECK(sx.text.find("signed") != std::string::npos);
  Out sv = sh("MLAJIT_CACHE_PATH= MLAJIT_REMOTE_CACHE_KEY_FILE=" + key.string() + " " + cli + " cache import " +
              signed_archive.string() + " --cache-dir " + (t.path / "sv").string());
  CHECK(sv.code == 0);
  CHECK(sv.text.find("signature verified") != std::string::npos);
  const fs::path wrong = t.path / "wrong";
  Out sw = sh("MLAJIT_CACHE_PATH= MLAJIT_REMOTE_CACHE_KEY_FILE=" + other.string() + " " + cli + " cache import " +
              signed_archive.string() + " --cache-dir " + wrong.string());
  CHECK(sw.code == 4);
  CHECK(sw.text.find("signature does not verify") != std::string::npos);
  CHECK(entries_in(wrong) == 0);
}

TEST_CASE("archive: a manifest with a duplicate key or nested beyond the limit is refused, naming it") {
  // An unsigned archive whose manifest is replaced (header length and checksum made to match), so
  // that only the manifest's JSON is wrong.
  const std::string data = pack_cache_archive(sample(), "");
  constexpr size_t kHeader = 8 + 4 + 4 + 4 + 32;
  const uint32_t manifest_len = static_cast<uint8_t>(data[12]) | static_cast<uint8_t>(data[13]) << 8 |
                                static_cast<uint8_t>(data[14]) << 16 | static_cast<uint32_t>(static_cast<uint8_t>(data[15])) << 24;
  const std::string manifest = data.substr(kHeader, manifest_len), body = data.substr(kHeader + manifest_len);
  REQUIRE(manifest.front() == '{');
  auto with_manifest = [&](const std::string& m) {
    std::string d = data.substr(0, 12);
    for (int i = 0; i < 4; ++i) d += static_cast<char>(m.size() >> (8 * i));
    d += data.substr(16, 4);  // no signature
    const auto sum = sha256(m);
    d.append(reinterpret_cast<const char*>(sum.data()), sum.size());
    return d + m + body;
  };
  CHECK(unpack_cache_archive(with_manifest(manifest), "", false).entries.size() == 3);  // the rebuild itself is sound
  std::string e = refusal(with_manifest("{\"format\":1," + manifest.substr(1)));
  CHECK(e.find("the manifest at manifest: got the key \"format\" twice") != std::string::npos);
  e = refusal(with_manifest("{\"x\":" + std::string(100000, '[') + std::string(100000, ']') + "," + manifest.substr(1)));
  CHECK(e.find("more than 64 nested arrays/objects") != std::string::npos);
  CHECK(e.size() < 600);
}
