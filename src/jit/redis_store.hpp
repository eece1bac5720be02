#pragma once
// RedisStore: RemoteStore over one hiredis connection (linked statically, so that the binaries
// run on machines without libhiredis). Collections are Redis hashes (HSETNX / HGETALL).
// A command that fails drops the connection; the next command reconnects. Commands are
// serialized on the one connection (the remote tier is consulted only on memory and disk misses).
#include <memory>
#include <mutex>
#include <string>

#include "jit/remote_store.hpp"

struct redisContext;

namespace mlajit {

struct RedisAddress {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
  std::string password;  // empty: no AUTH
  // Parses "redis://[:password@]host[:port][/db]"; throws Error(InvalidArgument) naming `url`.
  static RedisAddress parse(const std::string& url);
};

class RedisStore final : public RemoteStore {
 public:
  RedisStore(RedisAddress address, RemoteTimeouts timeouts);
  ~RedisStore() override;

  std::optional<std::string> get(const std::string& key) override;
  void put(const std::string& key, const std::string& value, long ttl_s) override;
  bool add_member(const std::string& set, const std::string& id, const std::string& value, long ttl_s) override;
  std::vector<std::pair<std::string, std::string>> members(const std::string& set) override;
  void ping() override;
  std::string describe() const override;

 private:
  struct Reply;
  // Runs one command (argv form: binary-safe) on a connected context; throws RemoteError.
  Reply command(std::initializer_list<std::string_view> argv);
  void connect_locked();
  void drop_locked();

  RedisAddress addr_;
  RemoteTimeouts timeouts_;
  std::mutex mu_;
  redisContext* ctx_ = nullptr;
};

}  // namespace mlajit
