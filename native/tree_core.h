// The tree cache's core in C++: per-state prefix trees, in-flight streams, suffix indexes, the
// byte estimate with LRU eviction, and best-first draft selection.
//
// It mirrors srt_agent/tree_cache (store.py, prefix_tree.py, suffix_index.py), which stays the
// reference: given the same byte model the two make the same drafts, evict the same states and
// save the same files (tests/test_tree_cache_native.py compares them operation by operation).
// Differences that do not change results: nodes live in one array with a free list (not objects),
// a node's children are a small vector (a hash map once wide), and the suffix indexes are keyed by
// the exact window tokens (Python files nodes under the tokens' hash and rejects collisions when it
// ranks candidates; here there are none).
//
// No Python here: tree_core_py.cpp binds it. Nothing locks; the Python facade holds a lock.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace srt {

constexpr int32_t kSentinel = -1;  // the token of a root
constexpr int kMaxWindow = 16;     // TreeCacheConfig caps window and backoff_window at 16

// The byte estimate's prices (see srt_agent/tree_cache/options.py and prefix_tree.py). The
// Python reference prices CPython objects; the native core prices its own arrays (native_bytes()).
struct ByteModel {
    int64_t node, small_map, map_entry, index_key, state, stream, stream_token, task;

    // Bytes of a container of n children (or of a key's n indexed nodes) beyond an inline one.
    int64_t container(int64_t n) const { return n <= 1 ? 0 : small_map + map_entry * std::max<int64_t>(0, n - 5); }
};

struct CoreOptions {
    std::vector<int> windows;  // fallback suffix lengths, tried in order
    int max_match = 16;
    int scan_limit = 16;
    int max_candidates = 8;
    int64_t byte_budget = 0;
    ByteModel bytes{};
};

// A query's committed tokens: the last ones of a sequence of `n` tokens, from index `off` on (a
// tail is enough for suffix matching; walking a state's tree needs them all, off == 0).
struct Gen {
    const int32_t* data = nullptr;
    int64_t n = 0;
    int64_t off = 0;
    int32_t at(int64_t i) const { return data[i - off]; }
};

enum Source : int { kNone = 0, kExact = 1, kTask = 2, kGlobal = 3 };

struct Draft {
    std::vector<int32_t> tokens, parents;
    std::vector<double> probs;
    std::vector<uint8_t> runahead;
    Source source = kNone;
    bool backoff = false;
    void clear() {
        tokens.clear();
        parents.clear();
        probs.clear();
        runahead.clear();
        source = kNone;
        backoff = false;
    }
};

enum class ExtendStatus { kOk, kMismatch };

// Where an in-flight stream stands: its node and state (-1: no usable cursor), and whether
// something followed the node (then the draft comes from it, without reading the query's tokens).
struct Cursor {
    int32_t node = -1, state = -1;
    bool has_kids = false;
};

// One state's tree as flat arrays, breadth-first (root first, parents before children).
struct TreeRows {
    std::string key, task;
    std::vector<int32_t> parents;
    std::vector<int64_t> tokens, counts, ends, live, ticks;
};

enum Counter : int {
    kDraftsExact,
    kDraftsTask,
    kDraftsGlobal,
    kDraftsNone,
    kNodesServed,
    kRunaheadServed,
    kTokensAdded,
    kEvictions,
    kNumCounters
};

class TreeCore {
public:
    explicit TreeCore(CoreOptions options);
    ~TreeCore();
    TreeCore(const TreeCore&) = delete;
    TreeCore& operator=(const TreeCore&) = delete;

    // --- inputs (see TreeCache.extend / insert / finish)
    ExtendStatus extend(const std::string& sid, const std::string& key, const std::string& task,
                        const int32_t* tokens, int64_t n, bool live);
    void insert(const std::string& key, const std::string& task, const int32_t* tokens, int64_t n, bool live);
    bool finish(const std::string& sid);
    // The key and kind of stream `sid` (for a mismatch's message); false if not in flight.
    bool stream_info(const std::string& sid, std::string* key, bool* live) const;

    // --- drafts
    // The node stream `sid` stands at, if it is in flight from `key` and reported exactly n tokens
    // ending with `last`; -1 otherwise.
    Cursor cursor(const std::string& sid, const std::string& key, int64_t n, int32_t last) const;
    bool has_state(const std::string& key) const { return state_of_.count(key) != 0; }
    // A draft of at most `budget` nodes; `cursor`: cursor() for the query, or none.
    void draft(const std::string& key, const std::string& task, const Gen& gen, const Cursor& cursor, int budget,
               Draft& out);

    // --- size and upkeep
    void enforce_budget();
    std::string evict_lru();
    std::vector<std::string> state_keys() const;  // least recently used first
    int64_t states() const { return static_cast<int64_t>(state_of_.size()); }
    int64_t nodes() const { return n_nodes_; }
    int64_t streams() const { return static_cast<int64_t>(stream_of_.size()); }
    int64_t bytes() const { return bytes_; }
    int64_t byte_budget() const { return opt_.byte_budget; }
    int64_t counter(int i) const { return counts_[i]; }
    void set_counter(int i, int64_t v) { counts_[i] = v; }
    int64_t next_tick() const { return tick_; }
    void set_next_tick(int64_t t) { tick_ = t; }
    const CoreOptions& options() const { return opt_; }

    // --- persistence
    std::vector<TreeRows> export_trees() const;  // in LRU order
    // Adopt a saved tree (not indexed yet: call index_all() once every tree is in). Throws
    // std::invalid_argument on a malformed tree.
    void import_tree(const TreeRows& rows);
    void index_all();  // index every node in creation order (as if built live)

    // Every invariant recomputed from scratch; empty if consistent.
    std::vector<std::string> problems() const;

private:
    struct Node {
        int32_t token, parent, kid, map;  // kid: the only child (map < 0) or -1
        int64_t count, ends, live, tick;
    };
    struct ChildMap {
        std::vector<std::pair<int32_t, int32_t>> items;  // (token, node), insertion order
        std::unique_ptr<std::unordered_map<int32_t, int32_t>> wide;  // token -> node, once wide
    };
    struct Key {
        int32_t len;
        int32_t t[kMaxWindow];
        bool operator==(const Key& o) const;
    };
    // A suffix index: an open-addressing table (linear probing, at most half full) of its keys,
    // each slot holding the key's hash and its nodes as a list through the nodes' links (oldest
    // first). A key's tokens are not stored: a slot holds a key when the hashes agree and the
    // window above the slot's oldest node spells it.
    struct Slot {
        uint64_t hash;
        int32_t head, tail;  // oldest, newest; head < 0: an empty slot
        int64_t n;
    };
    struct Index {
        int window = 0;
        std::vector<Slot> slots;
        int64_t keys = 0, nodes = 0, bytes = 0;
    };
    struct Task {
        std::string name;
        std::vector<Index> index;  // one per window
    };
    struct State {
        std::string key;
        Task* task = nullptr;
        int32_t root = -1;
        int64_t nodes = 0, bytes = 0;
        std::vector<int32_t> streams;
        int32_t prev = -1, next = -1;  // LRU list
    };
    struct Stream {
        std::string id, key;
        int32_t state = -1, node = -1;  // -1: detached (its state was evicted)
        bool live = true;
        std::vector<int32_t> tokens;
    };
    struct Link {
        int32_t prev, next;
    };

    // nodes
    int32_t new_node(int32_t token, int32_t parent, int64_t tick);
    bool has_kids(int32_t node) const { return nodes_[node].kid >= 0 || nodes_[node].map >= 0; }
    void free_node(int32_t node);
    int32_t child(int32_t node, int32_t token) const;
    int64_t add_child(int32_t parent, int32_t kid);  // returns bytes grown
    template <class F>
    void for_children(int32_t node, F&& f) const;
    int64_t n_children(int32_t node) const;
    std::vector<int32_t> subtree(int32_t root) const;  // breadth-first
    int32_t grow(int32_t state, int32_t parent, int32_t token, const std::vector<int32_t>* path);

    // states and streams
    int32_t touch_state(const std::string& key, const std::string& task);
    int32_t adopt(const std::string& key, const std::string& task, int32_t root);
    void lru_unlink(int32_t s);
    void lru_append(int32_t s);
    void touch(int32_t s);
    int32_t start_stream(const std::string& sid, const std::string& key, const std::string& task, bool live);
    int32_t locate(int32_t s, const Gen& gen) const;

    // suffix indexes
    Key node_key(int32_t node, int window) const;
    Key path_key(const std::vector<int32_t>& path, int window) const;
    Key query_key(const Gen& gen, int window, int64_t* need) const;
    static uint64_t key_hash(const Key& key);
    int64_t find_slot(const Index& idx, const Key& key, uint64_t hash) const;  // -1: no such key
    void place(Index& idx, const Slot& slot);
    void erase_slot(Index& idx, int64_t i);
    void index_node(int32_t state, int32_t node, const std::vector<int32_t>* path);
    int64_t index_add(Index& idx, int list, const Key& key, int32_t node);
    int64_t index_remove(Index& idx, int list, const Key& key, int32_t node);
    Link& link(int32_t node, int list) { return links_[static_cast<size_t>(node) * n_lists_ + list]; }
    const Link& link(int32_t node, int list) const { return links_[static_cast<size_t>(node) * n_lists_ + list]; }
    int64_t match_length(int32_t node, const Gen& gen, int limit) const;
    bool suffix_matches(const Index& idx, int list, const Gen& gen, int window, std::vector<int32_t>& out) const;
    void roots_for(const std::string& key, const std::string& task, const Gen& gen, const Cursor& cursor,
                   std::vector<int32_t>& roots, Source& source, bool& backoff);
    void select(const std::vector<int32_t>& roots, int budget, Draft& out);
    void push_children(const std::vector<int32_t>& group, double prob, int32_t depth, int32_t index, size_t limit);

    // checks
    void check_tree(int32_t s, std::vector<std::string>& problems) const;

    CoreOptions opt_;
    int n_windows_;
    int n_lists_;  // two per window: the global index's, the task's
    std::vector<Node> nodes_;
    std::vector<Link> links_;
    std::vector<int32_t> free_nodes_;
    std::vector<ChildMap> maps_;
    std::vector<int32_t> free_maps_;
    std::vector<State> states_;
    std::vector<int32_t> free_states_;
    std::unordered_map<std::string, int32_t> state_of_;
    int32_t lru_head_ = -1, lru_tail_ = -1;
    std::vector<Stream> streams_;
    std::vector<int32_t> free_streams_;
    std::unordered_map<std::string, int32_t> stream_of_;
    std::vector<Index> global_;
    std::unordered_map<std::string, std::unique_ptr<Task>> tasks_;
    int64_t bytes_ = 0, n_nodes_ = 0, tick_ = 0;
    int64_t counts_[kNumCounters] = {};
    // scratch for select()
    struct Item {
        double negp;
        int32_t depth, parent, token, gbeg, glen;
        int64_t live;
    };
    std::vector<Item> heap_, items_;
    std::vector<int32_t> arena_, roots_, group_;
};

// `draft` continuing `root` in SGLang's n-gram verification layout: `width` slots (the root, then
// the draft's first width - 1 nodes breadth-first, then distinct pads under the root) written to
// tokens[0..width) and the ancestor mask to mask[0..width*width). Mirrors
// srt_agent/integrations/sglang/layout.flat_tree. Throws std::invalid_argument when the
// vocabulary has too few tokens for distinct pads.
void flat_layout(const Draft& draft, int64_t root, int width, int64_t vocab_size, int64_t* tokens, int64_t* mask);

// The byte model of this core's own structures (sizes of its arrays and maps, amortised).
ByteModel native_bytes(int n_windows);

}  // namespace srt
