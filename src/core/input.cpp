// Bounded reading and parsing of untrusted input (see src/core/input.hpp).
#include "core/input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <unordered_set>
#include <vector>

#include "mlajit/error.hpp"

namespace mlajit {

using nlohmann::json;

const char* file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO (named pipe)";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
  }
}

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

[[noreturn]] void refuse_type(const std::string& path, std::string_view what, unsigned mode) {
  throw_invalid(fmt::format("{} {}", what, path), file_type_name(mode), "a regular file");
}

}  // namespace

void require_regular_file(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw_invalid(fmt::format("{} {}", what, path), fmt::format("a path that cannot be opened ({})", std::strerror(errno)),
                  "a readable regular file");
  if (!S_ISREG(st.st_mode)) refuse_type(path, what, st.st_mode);
}

std::string read_input_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  // stat first: a FIFO or device is refused without opening it (opening some devices has effects).
  require_regular_file(path, what);
  struct stat st {};
  // A path that cannot be opened is the caller's mistake (a usage error), as are the refusals below.
  auto unreadable = [&](const char* how) {
    throw_invalid(fmt::format("{} {}", what, path), fmt::format("a path that cannot be {} ({})", how, std::strerror(errno)),
                  "a readable regular file");
  };
  // O_NONBLOCK: should the path be swapped for a FIFO after the stat, the open does not wait for a
  // writer; the fstat below refuses it. (On a regular file O_NONBLOCK changes nothing.)
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)};
  if (f.fd < 0) unreadable("opened");
  if (::fstat(f.fd, &st) != 0) throw_error(ErrorKind::Io, "cannot stat {} {}: {}", what, path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) refuse_type(path, what, st.st_mode);
  auto too_large = [&](const std::string& size) {
    throw_invalid(fmt::format("{} {}", what, path), size, fmt::format("at most {} bytes", max_bytes));
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) too_large(fmt::format("{} bytes", st.st_size));
  std::string data;
  data.resize(static_cast<size_t>(st.st_size));
  size_t n = 0;
  while (true) {
    // The file may grow while it is read: read up to the cap and one byte more.
    if (n == data.size()) {
      if (n > max_bytes) too_large(fmt::format("more than {} bytes", max_bytes));
      data.resize(std::min<uint64_t>(max_bytes + 1, std::max<uint64_t>(n * 2, 4096)));
    }
    ssize_t r = ::read(f.fd, data.data() + n, data.size() - n);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_error(ErrorKind::Io, "cannot read {} {}: {}", what, path, std::strerror(errno));
    }
    if (r == 0) break;
    n += static_cast<size_t>(r);
  }
  if (n > max_bytes) too_large(fmt::format("more than {} bytes", max_bytes));
  data.resize(n);
  return data;
}

std::string json_quoted(std::string_view s, size_t max_chars) {
  const bool cut = s.size() > max_chars;
  // ensure_ascii: the message stays ASCII (a cut never splits a UTF-8 sequence in the output);
  // invalid UTF-8 is replaced, control characters (NUL included) are escaped.
  std::string q = json(std::string(cut ? s.substr(0, max_chars) : s)).dump(-1, ' ', true, json::error_handler_t::replace);
  if (cut) q += fmt::format("... ({} bytes)", s.size());
  return q;
}

std::string json_excerpt(const json& j, size_t max_chars) {
  std::string out;
  struct Frame {
    const json* v;
    json::const_iterator it;
    bool first;
  };
  std::vector<Frame> stack;
  auto open = [&](const json& v) {
    if (v.is_object() || v.is_array()) {
      out += v.is_object() ? '{' : '[';
      stack.push_back({&v, v.cbegin(), true});
    } else if (v.is_string()) {
      out += json_quoted(v.get_ref<const std::string&>(), max_chars);
    } else {
      out += v.dump();  // a number, bool, null or binary: no recursion
    }
  };
  open(j);
  // Depth-first with an explicit stack; stops once the excerpt is long enough, so neither the
  // value's depth nor its size matters.
  while (!stack.empty() && out.size() <= max_chars) {
    Frame& f = stack.back();
    if (f.it == f.v->cend()) {
      out += f.v->is_object() ? '}' : ']';
      stack.pop_back();
      continue;
    }
    if (!f.first) out += ',';
    f.first = false;
    const json& child = *f.it;
    if (f.v->is_object()) out += json_quoted(f.it.key(), max_chars) + ":";
    ++f.it;
    open(child);  // may grow the stack: `f` is not used after this
  }
  if (out.size() > max_chars) {
    out.resize(max_chars);
    out += "...";
  }
  return out;
}

void check_json_depth(const json& j, std::string_view what, int max_depth) {
  std::vector<std::pair<const json*, int>> stack{{&j, 0}};
  while (!stack.empty()) {
    auto [v, depth] = stack.back();
    stack.pop_back();
    if (!v->is_object() && !v->is_array()) continue;
    if (depth >= max_depth)
      throw_invalid(what, fmt::format("more than {} nested arrays/objects", max_depth),
                    fmt::format("at most {} levels of nesting", max_depth));
    for (const auto& child : *v) stack.emplace_back(&child, depth + 1);
  }
}

namespace {

bool is_identifier(std::string_view k) {
  if (k.empty() || k.size() > 64) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

}  // namespace

std::string path_key(std::string_view key);

namespace {

// The parse position as a JSON path: root.key[3].other; bounded (long paths keep head and tail).
struct PathFrame {
  bool object;
  std::string key;
  size_t index = 0;
  std::unordered_set<std::string> keys;
};

std::string path_of(std::string_view root, const std::vector<PathFrame>& stack, size_t frames) {
  std::string p(root);
  for (size_t i = 0; i < frames && i < stack.size(); ++i) {
    const PathFrame& f = stack[i];
    if (!f.object) p += fmt::format("[{}]", f.index);
    else p += path_key(f.key);
  }
  constexpr size_t kHead = 60, kTail = 140;
  if (p.size() > kHead + kTail + 3) p = p.substr(0, kHead) + "..." + p.substr(p.size() - kTail);
  return p;
}

}  // namespace

std::string path_key(std::string_view key) {
  return is_identifier(key) ? "." + std::string(key) : "[" + json_quoted(key, 40) + "]";
}

json parse_json_input(std::string_view text, std::string_view what, std::string_view root, int max_depth) {
  // The parser is iterative; this callback sees each event before the DOM grows: it refuses a
  // container beyond max_depth (so no deeper value is ever built, and later recursive walks such
  // as dump() or a copy stay within max_depth) and a key already seen in the same object.
  std::vector<PathFrame> stack;
  auto cb = [&](int, json::parse_event_t ev, json& parsed) -> bool {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(stack.size()) >= max_depth)
          throw_invalid(fmt::format("{} at {}", what, path_of(root, stack, stack.size())),
                        fmt::format("more than {} nested arrays/objects", max_depth),
                        fmt::format("at most {} levels of nesting", max_depth));
        stack.push_back({ev == json::parse_event_t::object_start, {}, 0, {}});
        break;
      case json::parse_event_t::key: {
        PathFrame& f = stack.back();
        std::string k = parsed.get<std::string>();
        if (!f.keys.insert(k).second)
          throw_invalid(fmt::format("{} at {}", what, path_of(root, stack, stack.size() - 1)),
                        fmt::format("the key {} twice", json_quoted(k)), "each key at most once in an object");
        f.key = std::move(k);
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        stack.pop_back();
        if (!stack.empty() && !stack.back().object) ++stack.back().index;
        break;
      case json::parse_event_t::value:
        if (!stack.empty() && !stack.back().object) ++stack.back().index;
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb);
  } catch (const json::exception& e) {
    // nlohmann's message quotes the last token read: bound it like any excerpt.
    std::string msg = e.what();
    if (msg.size() > 2 * kMaxExcerptChars) msg = msg.substr(0, 2 * kMaxExcerptChars) + "...";
    for (char& c : msg)
      if (static_cast<unsigned char>(c) < 0x20) c = ' ';
    throw_invalid(what, msg, "valid JSON");
  }
}

}  // namespace mlajit
