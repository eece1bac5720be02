#pragma once
// SingleFlightCache: the runtime's in-memory map from a key to a loaded value, built for a hot
// path that is a lookup. Sharded by hash, each shard read-mostly under a shared_mutex: a hit takes
// one shared lock of one shard and copies a shared_ptr. A miss inserts a pending slot; the first
// caller (the leader) builds the value outside the lock while later callers for the same key wait
// on the leader's shared_future, so N concurrent requests build once. A failed build is removed
// (the next request retries) and its exception is rethrown to every waiter.
#include <array>
#include <cstddef>
#include <future>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace mlajit::detail {

template <typename Key, typename Value>
class SingleFlightCache {
 public:
  using Ptr = std::shared_ptr<const Value>;

  // The value of `key` (whose hash the caller computed once), building it with make() on a miss.
  template <typename Make>
  Ptr get(const Key& key, size_t hash, Make&& make) {
    Shard& s = shards_[hash % kShards];
    Hashed hk{hash, key};
    {
      std::shared_lock<std::shared_mutex> lk(s.mu);
      auto it = s.map.find(hk);
      if (it != s.map.end() && it->second.value) return it->second.value;
    }
    std::promise<Ptr> promise;
    std::shared_future<Ptr> pending;
    {
      std::unique_lock<std::shared_mutex> lk(s.mu);
      auto [it, inserted] = s.map.try_emplace(hk);
      if (!inserted) {
        if (it->second.value) return it->second.value;
        pending = it->second.pending;
      } else {
        it->second.pending = promise.get_future().share();
      }
    }
    if (pending.valid()) return pending.get();  // another thread is building it

    Ptr value;
    try {
      value = make();
    } catch (...) {
      {
        std::unique_lock<std::shared_mutex> lk(s.mu);
        s.map.erase(hk);
      }
      promise.set_exception(std::current_exception());
      throw;
    }
    {
      std::unique_lock<std::shared_mutex> lk(s.mu);
      auto& slot = s.map[hk];
      slot.value = value;
      slot.pending = {};
    }
    promise.set_value(value);
    return value;
  }

  size_t size() const {
    size_t n = 0;
    for (auto& s : shards_) {
      std::shared_lock<std::shared_mutex> lk(s.mu);
      for (auto& kv : s.map) n += kv.second.value ? 1 : 0;
    }
    return n;
  }

 private:
  static constexpr size_t kShards = 16;
  struct Hashed {
    size_t hash;
    Key key;
    bool operator==(const Hashed& o) const { return hash == o.hash && key == o.key; }
  };
  struct HashOf {
    size_t operator()(const Hashed& h) const { return h.hash; }
  };
  struct Slot {
    Ptr value;                        // set once built
    std::shared_future<Ptr> pending;  // valid while building
  };
  struct alignas(64) Shard {
    mutable std::shared_mutex mu;
    std::unordered_map<Hashed, Slot, HashOf> map;
  };
  std::array<Shard, kShards> shards_;
};

}  // namespace mlajit::detail
