#pragma once
// RemoteStore: the few operations the fleet cache needs from a shared key-value store. Redis is
// one implementation (jit/redis_store.hpp); another store is one more file implementing this.
//
// Every operation either succeeds or throws RemoteError; the caller (jit/remote_cache.hpp)
// decides what a failure means (it never is fatal). Values are opaque bytes: the caller signs
// and verifies them, a store is trusted with nothing but availability.
// Implementations must be safe to call from several threads at once.
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mlajit {

struct RemoteError : std::runtime_error {
  // unavailable: the store cannot be reached or did not answer in time (connection refused,
  // reset, timeout); false: it answered with an error (full, refused the command, ...).
  RemoteError(std::string what, bool unavailable) : std::runtime_error(std::move(what)), unavailable(unavailable) {}
  bool unavailable;
};

struct RemoteTimeouts {
  std::chrono::milliseconds connect{200};
  std::chrono::milliseconds command{1000};
};

class RemoteStore {
 public:
  virtual ~RemoteStore() = default;
  // The value stored under `key`, or nullopt when there is none.
  virtual std::optional<std::string> get(const std::string& key) = 0;
  // Stores (or replaces) `value` under `key`; ttl_s > 0: the store may drop it after that many seconds.
  virtual void put(const std::string& key, const std::string& value, long ttl_s) = 0;
  // Adds `value` as member `id` of the collection `set` unless a member `id` exists already
  // (never replaces one); returns whether it was added. ttl_s > 0 refreshes the collection's TTL.
  virtual bool add_member(const std::string& set, const std::string& id, const std::string& value, long ttl_s) = 0;
  // Every (id, value) of the collection `set` (empty when there is none).
  virtual std::vector<std::pair<std::string, std::string>> members(const std::string& set) = 0;
  // Round trip to the store; throws when it is not reachable.
  virtual void ping() = 0;
  // Where it is, for messages ("redis://10.0.0.5:6379/0"); never contains a password.
  virtual std::string describe() const = 0;
};

// The store a connection string names: "redis://[:password@]host[:port][/db]". Connects lazily
// (constructing never touches the network). Throws Error(InvalidArgument) for a malformed or
// unsupported string.
std::unique_ptr<RemoteStore> open_remote_store(const std::string& url, RemoteTimeouts timeouts);

}  // namespace mlajit
