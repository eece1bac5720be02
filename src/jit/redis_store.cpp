// RedisStore over hiredis (jit/redis_store.hpp).
#include "jit/redis_store.hpp"

#include <sys/time.h>

#include <cerrno>
#include <cstring>

#include <hiredis/hiredis.h>

#include "mlajit/error.hpp"

namespace mlajit {

namespace {

timeval to_timeval(std::chrono::milliseconds ms) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};

}  // namespace

struct RedisStore::Reply {
  std::unique_ptr<redisReply, ReplyDeleter> r;
  redisReply* operator->() const { return r.get(); }
};

RedisAddress RedisAddress::parse(const std::string& url) {
  const std::string scheme = "redis://";
  // Errors show the string with its password masked: they end up in logs.
  std::string shown = url;
  if (auto at = shown.rfind('@'); at != std::string::npos && shown.size() > scheme.size() &&
                                  shown.compare(0, scheme.size(), scheme) == 0)
    shown = scheme + "***@" + shown.substr(at + 1);
  auto bad = [&](const char* what) -> RedisAddress {
    throw_invalid("MLAJIT_REMOTE_CACHE", shown, std::string("redis://[:password@]host[:port][/db] (") + what + ")");
  };
  if (url.compare(0, scheme.size(), scheme) != 0) return bad("only the redis:// scheme is supported");
  RedisAddress a;
  std::string rest = url.substr(scheme.size());
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    std::string user_pw = rest.substr(0, at);
    rest = rest.substr(at + 1);
    auto colon = user_pw.find(':');
    a.password = colon == std::string::npos ? user_pw : user_pw.substr(colon + 1);
  }
  std::string hostport = rest;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    hostport = rest.substr(0, slash);
    std::string db = rest.substr(slash + 1);
    if (!db.empty()) {
      if (db.find_first_not_of("0123456789") != std::string::npos || db.size() > 5) return bad("the db is a number");
      a.db = std::stoi(db);
    }
  }
  if (auto colon = hostport.rfind(':'); colon != std::string::npos && hostport.find(']') == std::string::npos) {
    std::string port = hostport.substr(colon + 1);
    hostport = hostport.substr(0, colon);
    if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      return bad("the port is 1..65535");
    a.port = std::stoi(port);
  }
  if (hostport.empty()) return bad("no host");
  a.host = hostport;
  return a;
}

RedisStore::RedisStore(RedisAddress address, RemoteTimeouts timeouts) : addr_(std::move(address)), timeouts_(timeouts) {}

RedisStore::~RedisStore() {
  std::lock_guard<std::mutex> lk(mu_);
  drop_locked();
}

std::string RedisStore::describe() const { return fmt::format("redis://{}:{}/{}", addr_.host, addr_.port, addr_.db); }

void RedisStore::drop_locked() {
  if (ctx_) redisFree(ctx_);
  ctx_ = nullptr;
}

void RedisStore::connect_locked() {
  if (ctx_) return;
  redisContext* c = redisConnectWithTimeout(addr_.host.c_str(), addr_.port, to_timeval(timeouts_.connect));
  if (!c) throw RemoteError(fmt::format("{}: cannot allocate a connection", describe()), true);
  if (c->err) {
    std::string why = c->errstr;
    redisFree(c);
    throw RemoteError(fmt::format("cannot connect to {} within {} ms: {}", describe(), timeouts_.connect.count(), why), true);
  }
  redisSetTimeout(c, to_timeval(timeouts_.command));
  ctx_ = c;
  auto setup = [&](std::initializer_list<const char*> args) {
    std::vector<const char*> argv(args);
    std::vector<size_t> lens;
    for (auto* a : argv) lens.push_back(std::strlen(a));
    std::unique_ptr<redisReply, ReplyDeleter> r(
        static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!r) {
      std::string why = ctx_->errstr;
      drop_locked();
      throw RemoteError(fmt::format("{}: {}", describe(), why), true);
    }
    if (r->type == REDIS_REPLY_ERROR) {
      std::string why(r->str, r->len);
      drop_locked();
      throw RemoteError(fmt::format("{}: {} refused: {}", describe(), *args.begin(), why), false);
    }
  };
  if (!addr_.password.empty()) setup({"AUTH", addr_.password.c_str()});
  if (addr_.db != 0) setup({"SELECT", std::to_string(addr_.db).c_str()});
}

RedisStore::Reply RedisStore::command(std::initializer_list<std::string_view> args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  std::lock_guard<std::mutex> lk(mu_);
  connect_locked();
  Reply reply{std::unique_ptr<redisReply, ReplyDeleter>(
      static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data())))};
  if (!reply.r) {
    // I/O error, timeout (EAGAIN) or a closed connection: the context is unusable afterwards.
    bool timeout = ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
    std::string why = timeout ? fmt::format("no answer within {} ms", timeouts_.command.count()) : std::string(ctx_->errstr);
    drop_locked();
    throw RemoteError(fmt::format("{} {}: {}", describe(), *args.begin(), why), true);
  }
  if (reply->type == REDIS_REPLY_ERROR)
    throw RemoteError(fmt::format("{} {}: {}", describe(), *args.begin(), std::string(reply->str, reply->len)), false);
  return reply;
}

std::optional<std::string> RedisStore::get(const std::string& key) {
  Reply r = command({"GET", key});
  if (r->type == REDIS_REPLY_NIL) return std::nullopt;
  if (r->type != REDIS_REPLY_STRING) throw RemoteError(fmt::format("{} GET: unexpected reply type {}", describe(), r->type), false);
  return std::string(r->str, r->len);
}

void RedisStore::put(const std::string& key, const std::string& value, long ttl_s) {
  if (ttl_s > 0) command({"SET", key, value, "EX", std::to_string(ttl_s)});
  else command({"SET", key, value});
}

bool RedisStore::add_member(const std::string& set, const std::string& id, const std::string& value, long ttl_s) {
  Reply r = command({"HSETNX", set, id, value});
  bool added = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
  if (ttl_s > 0) command({"EXPIRE", set, std::to_string(ttl_s)});
  return added;
}

std::vector<std::pair<std::string, std::string>> RedisStore::members(const std::string& set) {
  Reply r = command({"HGETALL", set});
  std::vector<std::pair<std::string, std::string>> out;
  if (r->type != REDIS_REPLY_ARRAY) throw RemoteError(fmt::format("{} HGETALL: unexpected reply type {}", describe(), r->type), false);
  for (size_t i = 0; i + 1 < r->elements; i += 2) {
    auto* k = r->element[i];
    auto* v = r->element[i + 1];
    if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING) continue;
    out.emplace_back(std::string(k->str, k->len), std::string(v->str, v->len));
  }
  return out;
}

void RedisStore::ping() { command({"PING"}); }

std::unique_ptr<RemoteStore> open_remote_store(const std::string& url, RemoteTimeouts timeouts) {
  // One line per backend: the scheme picks the store.
  if (url.rfind("redis://", 0) == 0) return std::make_unique<RedisStore>(RedisAddress::parse(url), timeouts);
  throw_invalid("MLAJIT_REMOTE_CACHE", url, "a redis://host:port/db connection string (the only backend so far)");
}

}  // namespace mlajit
