// The tree cache's core (see tree_core.h). Each function names its Python twin in
// srt_agent/tree_cache; keep them in step (tests/test_tree_cache_native.py compares the two).
#include "tree_core.h"

#include <cstring>
#include <stdexcept>

namespace srt {

namespace {
constexpr size_t kWide = 16;  // children kept in a scanned vector up to this many, then hashed too

// A slot of `items` for a new element: a freed one if any, else a new one at the end.
template <class T>
int32_t take_slot(std::vector<T>& items, std::vector<int32_t>& free) {
    if (!free.empty()) {
        const int32_t id = free.back();
        free.pop_back();
        return id;
    }
    if (items.size() >= static_cast<size_t>(INT32_MAX)) throw std::length_error("tree cache: too many items");
    items.emplace_back();
    return static_cast<int32_t>(items.size() - 1);
}
}  // namespace

bool TreeCore::Key::operator==(const Key& o) const {
    return len == o.len && std::memcmp(t, o.t, sizeof(int32_t) * static_cast<size_t>(len)) == 0;
}

uint64_t TreeCore::key_hash(const Key& k) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(k.len);
    for (int i = 0; i < k.len; ++i) {
        h ^= static_cast<uint32_t>(k.t[i]);
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    h ^= h >> 33;  // murmur's finaliser: the table indexes by the low bits
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 33;
    return h;
}

ByteModel native_bytes(int n_windows) {
    // What this core allocates, amortised: a node is its 48-byte record plus two links (8 bytes
    // each) per index it is filed in; a child map is its struct and a vector of (token, node) pairs;
    // an index key is a 24-byte slot of a table kept between a quarter and half full; states and
    // streams are their structs, strings and map entries.
    const int64_t node = 48 + 16 * 2 * n_windows;
    return ByteModel{node, 96, 8, 64, 256, 192, 4, 160 * n_windows};
}

TreeCore::TreeCore(CoreOptions options) : opt_(std::move(options)) {
    n_windows_ = static_cast<int>(opt_.windows.size());
    if (n_windows_ < 1 || n_windows_ > 2) throw std::invalid_argument("tree cache: one or two fallback windows");
    for (int w : opt_.windows)
        if (w < 1 || w > kMaxWindow) throw std::invalid_argument("tree cache: windows must be in [1, 16]");
    if (opt_.max_match < 1 || opt_.scan_limit < 1 || opt_.max_candidates < 1)
        throw std::invalid_argument("tree cache: max_match, scan_limit and max_candidates must be >= 1");
    n_lists_ = 2 * n_windows_;
    global_.resize(n_windows_);
    for (int i = 0; i < n_windows_; ++i) global_[i].window = opt_.windows[i];
}

TreeCore::~TreeCore() = default;

// ------------------------------------------------------------------ nodes (prefix_tree.py)

int32_t TreeCore::new_node(int32_t token, int32_t parent, int64_t tick) {
    const int32_t id = take_slot(nodes_, free_nodes_);
    if (links_.size() < nodes_.size() * static_cast<size_t>(n_lists_)) links_.resize(nodes_.size() * n_lists_);
    nodes_[id] = Node{token, parent, -1, -1, 0, 0, 0, tick};
    for (int l = 0; l < n_lists_; ++l) link(id, l) = Link{-1, -1};
    return id;
}

void TreeCore::free_node(int32_t node) {
    const int32_t m = nodes_[node].map;
    if (m >= 0) {
        maps_[m].items.clear();
        maps_[m].items.shrink_to_fit();
        maps_[m].wide.reset();
        free_maps_.push_back(m);
    }
    nodes_[node].map = nodes_[node].kid = -1;
    free_nodes_.push_back(node);
}

int32_t TreeCore::child(int32_t node, int32_t token) const {
    const Node& n = nodes_[node];
    if (n.map < 0) return n.kid >= 0 && nodes_[n.kid].token == token ? n.kid : -1;
    const ChildMap& m = maps_[n.map];
    if (m.wide) {
        auto it = m.wide->find(token);
        return it == m.wide->end() ? -1 : it->second;
    }
    for (const auto& p : m.items)
        if (p.first == token) return p.second;
    return -1;
}

template <class F>
void TreeCore::for_children(int32_t node, F&& f) const {
    const Node& n = nodes_[node];
    if (n.map < 0) {
        if (n.kid >= 0) f(n.kid);
        return;
    }
    for (const auto& p : maps_[n.map].items) f(p.second);
}

int64_t TreeCore::n_children(int32_t node) const {
    const Node& n = nodes_[node];
    if (n.map >= 0) return static_cast<int64_t>(maps_[n.map].items.size());
    return n.kid >= 0 ? 1 : 0;
}

// add_child: file node `kid` under `parent`; returns the bytes the tree grew by.
int64_t TreeCore::add_child(int32_t parent, int32_t kid) {
    const ByteModel& b = opt_.bytes;
    const int32_t token = nodes_[kid].token;
    if (nodes_[parent].map < 0) {
        if (nodes_[parent].kid < 0) {
            nodes_[parent].kid = kid;
            return b.node;
        }
        const int32_t m = take_slot(maps_, free_maps_);
        const int32_t first = nodes_[parent].kid;
        maps_[m].items = {{nodes_[first].token, first}, {token, kid}};
        nodes_[parent].map = m;
        nodes_[parent].kid = -1;
        return b.node + b.container(2);
    }
    ChildMap& m = maps_[nodes_[parent].map];
    m.items.emplace_back(token, kid);
    const size_t n = m.items.size();
    if (m.wide) {
        (*m.wide)[token] = kid;
    } else if (n > kWide) {
        m.wide = std::make_unique<std::unordered_map<int32_t, int32_t>>();
        for (const auto& p : m.items) (*m.wide)[p.first] = p.second;
    }
    return b.node + b.container(static_cast<int64_t>(n)) - b.container(static_cast<int64_t>(n) - 1);
}

std::vector<int32_t> TreeCore::subtree(int32_t root) const {
    std::vector<int32_t> order{root};
    for (size_t i = 0; i < order.size(); ++i) for_children(order[i], [&](int32_t c) { order.push_back(c); });
    return order;
}

// ------------------------------------------------------------------ states and streams (store.py)

void TreeCore::lru_unlink(int32_t s) {
    State& st = states_[s];
    (st.prev >= 0 ? states_[st.prev].next : lru_head_) = st.next;
    (st.next >= 0 ? states_[st.next].prev : lru_tail_) = st.prev;
    st.prev = st.next = -1;
}

void TreeCore::lru_append(int32_t s) {
    State& st = states_[s];
    st.prev = lru_tail_;
    st.next = -1;
    (lru_tail_ >= 0 ? states_[lru_tail_].next : lru_head_) = s;
    lru_tail_ = s;
}

void TreeCore::touch(int32_t s) {
    if (s == lru_tail_) return;
    lru_unlink(s);
    lru_append(s);
}

// TreeStore._state
int32_t TreeCore::touch_state(const std::string& key, const std::string& task) {
    auto it = state_of_.find(key);
    if (it != state_of_.end()) {
        touch(it->second);
        return it->second;
    }
    const int32_t root = new_node(kSentinel, -1, tick_++);
    const int32_t s = adopt(key, task, root);
    index_node(s, root, nullptr);
    return s;
}

// TreeStore._adopt
int32_t TreeCore::adopt(const std::string& key, const std::string& task, int32_t root) {
    const ByteModel& b = opt_.bytes;
    Task* t = nullptr;
    if (!task.empty()) {
        auto it = tasks_.find(task);
        if (it == tasks_.end()) {
            auto fresh = std::make_unique<Task>();
            fresh->name = task;
            fresh->index.resize(n_windows_);
            for (int i = 0; i < n_windows_; ++i) fresh->index[i].window = opt_.windows[i];
            t = fresh.get();
            tasks_.emplace(task, std::move(fresh));
            bytes_ += b.task * n_windows_;
        } else {
            t = it->second.get();
        }
    }
    const int32_t s = take_slot(states_, free_states_);
    int64_t n = 0, tree = 0;
    for (int32_t x : subtree(root)) {
        ++n;
        tree += b.node + b.container(n_children(x));
    }
    State& st = states_[s];
    st.key = key;
    st.task = t;
    st.root = root;
    st.nodes = n;
    st.bytes = b.state + tree;
    st.streams.clear();
    state_of_[key] = s;
    lru_append(s);
    bytes_ += st.bytes;
    n_nodes_ += n;
    return s;
}

// TreeStore._start_stream
int32_t TreeCore::start_stream(const std::string& sid, const std::string& key, const std::string& task, bool live) {
    const int32_t s = touch_state(key, task);
    const int32_t id = take_slot(streams_, free_streams_);
    Stream& st = streams_[id];
    st.id = sid;
    st.key = key;
    st.state = s;
    st.node = states_[s].root;
    st.live = live;
    st.tokens.clear();
    Node& r = nodes_[st.node];
    r.count += 1;
    r.ends += 1;
    r.live += live ? 1 : 0;
    states_[s].streams.push_back(id);
    stream_of_[sid] = id;
    bytes_ += opt_.bytes.stream;
    return id;
}

// TreeStore._grow
int32_t TreeCore::grow(int32_t s, int32_t parent, int32_t token, const std::vector<int32_t>* path) {
    const int32_t id = new_node(token, parent, tick_++);
    const int64_t grown = add_child(parent, id);
    states_[s].nodes += 1;
    states_[s].bytes += grown;
    n_nodes_ += 1;
    bytes_ += grown;
    index_node(s, id, path);
    return id;
}

// TreeCache._extend
ExtendStatus TreeCore::extend(const std::string& sid, const std::string& key, const std::string& task,
                              const int32_t* tokens, int64_t n, bool live) {
    auto it = stream_of_.find(sid);
    int32_t id;
    if (it == stream_of_.end()) {
        id = start_stream(sid, key, task, live);
    } else {
        id = it->second;
        if (streams_[id].key != key || streams_[id].live != live) return ExtendStatus::kMismatch;
    }
    Stream& st = streams_[id];
    if (st.state < 0) return ExtendStatus::kOk;  // detached: its state was evicted
    touch(st.state);
    const int64_t lv = st.live ? 1 : 0;
    int32_t node = st.node;
    for (int64_t i = 0; i < n; ++i) {
        const int32_t t = tokens[i];
        nodes_[node].ends -= 1;
        st.tokens.push_back(t);
        int32_t next = child(node, t);
        if (next < 0) next = grow(st.state, node, t, &st.tokens);
        Node& x = nodes_[next];
        x.count += 1;
        x.ends += 1;
        x.live += lv;
        node = next;
    }
    st.node = node;
    counts_[kTokensAdded] += n;
    bytes_ += opt_.bytes.stream_token * n;
    return ExtendStatus::kOk;
}

// TreeCache.insert
void TreeCore::insert(const std::string& key, const std::string& task, const int32_t* tokens, int64_t n, bool live) {
    const int32_t s = touch_state(key, task);
    const int64_t lv = live ? 1 : 0;
    int32_t node = states_[s].root;
    nodes_[node].count += 1;
    nodes_[node].live += lv;
    for (int64_t i = 0; i < n; ++i) {
        int32_t next = child(node, tokens[i]);
        if (next < 0) next = grow(s, node, tokens[i], nullptr);
        nodes_[next].count += 1;
        nodes_[next].live += lv;
        node = next;
    }
    nodes_[node].ends += 1;
    counts_[kTokensAdded] += n;
    enforce_budget();
}

// TreeCache.finish
bool TreeCore::finish(const std::string& sid) {
    auto it = stream_of_.find(sid);
    if (it == stream_of_.end()) return false;
    const int32_t id = it->second;
    Stream& st = streams_[id];
    bytes_ -= opt_.bytes.stream + opt_.bytes.stream_token * static_cast<int64_t>(st.tokens.size());
    if (st.state >= 0) {
        auto& list = states_[st.state].streams;
        list.erase(std::find(list.begin(), list.end(), id));
    }
    stream_of_.erase(it);
    st = Stream{};
    free_streams_.push_back(id);
    return true;
}

bool TreeCore::stream_info(const std::string& sid, std::string* key, bool* live) const {
    auto it = stream_of_.find(sid);
    if (it == stream_of_.end()) return false;
    *key = streams_[it->second].key;
    *live = streams_[it->second].live;
    return true;
}

// TreeCache._cursor
Cursor TreeCore::cursor(const std::string& sid, const std::string& key, int64_t n, int32_t last) const {
    auto it = stream_of_.find(sid);
    if (it == stream_of_.end()) return Cursor{};
    const Stream& st = streams_[it->second];
    if (st.node < 0 || st.key != key || static_cast<int64_t>(st.tokens.size()) != n) return Cursor{};
    if (n && st.tokens.back() != last) return Cursor{};
    return Cursor{st.node, st.state, has_kids(st.node)};
}

// TreeStore._locate (gen must hold every token: off == 0)
int32_t TreeCore::locate(int32_t s, const Gen& gen) const {
    int32_t node = states_[s].root;
    int64_t done = 0;
    for (int32_t id : states_[s].streams) {  // a stream whose tokens are a prefix of gen: a head start
        const Stream& x = streams_[id];
        const int64_t m = static_cast<int64_t>(x.tokens.size());
        if (done < m && m <= gen.n && x.tokens[m - 1] == gen.data[m - 1] &&
            std::memcmp(x.tokens.data(), gen.data, sizeof(int32_t) * static_cast<size_t>(m)) == 0) {
            node = x.node;
            done = m;
            if (m == gen.n) return node;
        }
    }
    for (int64_t i = done; i < gen.n; ++i) {
        node = child(node, gen.data[i]);
        if (node < 0) return -1;
    }
    return node;
}

// ------------------------------------------------------------------ suffix indexes (suffix_index.py)

// node_key: the last `window` tokens of [SENTINEL] + the node's path (all of it when shorter).
TreeCore::Key TreeCore::node_key(int32_t node, int window) const {
    int32_t up[kMaxWindow];
    int c = 0;
    for (int32_t x = node; nodes_[x].parent >= 0 && c < window; x = nodes_[x].parent) up[c++] = nodes_[x].token;
    Key k;
    if (c >= window) {
        k.len = window;
        for (int j = 0; j < window; ++j) k.t[j] = up[window - 1 - j];
    } else {
        k.len = c + 1;
        k.t[0] = kSentinel;
        for (int j = 0; j < c; ++j) k.t[j + 1] = up[c - 1 - j];
    }
    return k;
}

// path_keys
TreeCore::Key TreeCore::path_key(const std::vector<int32_t>& path, int window) const {
    const int64_t n = static_cast<int64_t>(path.size());
    Key k;
    if (n >= window) {
        k.len = window;
        std::memcpy(k.t, path.data() + (n - window), sizeof(int32_t) * static_cast<size_t>(window));
    } else {
        k.len = static_cast<int32_t>(n + 1);
        k.t[0] = kSentinel;
        std::memcpy(k.t + 1, path.data(), sizeof(int32_t) * static_cast<size_t>(n));
    }
    return k;
}

// query_key
TreeCore::Key TreeCore::query_key(const Gen& gen, int window, int64_t* need) const {
    Key k;
    if (gen.n >= window) {
        k.len = window;
        for (int j = 0; j < window; ++j) k.t[j] = gen.at(gen.n - window + j);
    } else {
        k.len = static_cast<int32_t>(gen.n + 1);
        k.t[0] = kSentinel;
        for (int64_t j = 0; j < gen.n; ++j) k.t[j + 1] = gen.at(j);
    }
    *need = k.len;
    return k;
}

// TreeStore._index
void TreeCore::index_node(int32_t s, int32_t node, const std::vector<int32_t>* path) {
    Task* task = states_[s].task;
    for (int i = 0; i < n_windows_; ++i) {
        const int w = opt_.windows[i];
        const Key k = path ? path_key(*path, w) : node_key(node, w);
        bytes_ += index_add(global_[i], 2 * i, k, node);
        if (task) bytes_ += index_add(task->index[i], 2 * i + 1, k, node);
    }
}

int64_t TreeCore::find_slot(const Index& idx, const Key& key, uint64_t hash) const {
    if (idx.slots.empty()) return -1;
    const size_t mask = idx.slots.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        const Slot& s = idx.slots[i];
        if (s.head < 0) return -1;
        if (s.hash == hash && node_key(s.head, idx.window) == key) return static_cast<int64_t>(i);
    }
}

// Put `slot` (a key not in the table) in its first free place, doubling the table past half full.
void TreeCore::place(Index& idx, const Slot& slot) {
    if (static_cast<size_t>(idx.keys + 1) * 2 > idx.slots.size()) {
        std::vector<Slot> old(std::max<size_t>(16, idx.slots.size() * 2), Slot{0, -1, -1, 0});
        old.swap(idx.slots);
        idx.keys = 0;
        for (const Slot& s : old)
            if (s.head >= 0) place(idx, s);
    }
    const size_t mask = idx.slots.size() - 1;
    size_t i = slot.hash & mask;
    while (idx.slots[i].head >= 0) i = (i + 1) & mask;
    idx.slots[i] = slot;
    idx.keys += 1;
}

// Empty slot i, moving later slots of its probe run back (no tombstones: lookups stay short).
void TreeCore::erase_slot(Index& idx, int64_t at) {
    const size_t mask = idx.slots.size() - 1;
    size_t i = static_cast<size_t>(at);
    for (size_t j = (i + 1) & mask; idx.slots[j].head >= 0; j = (j + 1) & mask) {
        const size_t home = idx.slots[j].hash & mask;
        // Slot j may move to the hole at i when its home is not cyclically within (i, j].
        const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            idx.slots[i] = idx.slots[j];
            i = j;
        }
    }
    idx.slots[i] = Slot{0, -1, -1, 0};
    idx.keys -= 1;
}

// SuffixIndex.add: the key's nodes are a list through the nodes' links, oldest first.
int64_t TreeCore::index_add(Index& idx, int list, const Key& key, int32_t node) {
    const ByteModel& b = opt_.bytes;
    const uint64_t hash = key_hash(key);
    const int64_t at = find_slot(idx, key, hash);
    Link& l = link(node, list);
    int64_t grown;
    if (at < 0) {
        l = Link{-1, -1};
        place(idx, Slot{hash, node, node, 1});
        grown = b.index_key;
    } else {
        Slot& e = idx.slots[at];
        l = Link{e.tail, -1};
        link(e.tail, list).next = node;
        e.tail = node;
        e.n += 1;
        grown = b.container(e.n) - b.container(e.n - 1);
    }
    idx.nodes += 1;
    idx.bytes += grown;
    return grown;
}

// SuffixIndex.remove
int64_t TreeCore::index_remove(Index& idx, int list, const Key& key, int32_t node) {
    const int64_t at = find_slot(idx, key, key_hash(key));
    if (at < 0) throw std::logic_error("tree cache: a node is not filed under its key");
    Slot& e = idx.slots[at];
    Link& l = link(node, list);
    (l.prev >= 0 ? link(l.prev, list).next : e.head) = l.next;
    (l.next >= 0 ? link(l.next, list).prev : e.tail) = l.prev;
    l = Link{-1, -1};
    e.n -= 1;
    int64_t freed;
    if (e.n == 0) {
        erase_slot(idx, at);
        freed = opt_.bytes.index_key;
    } else {
        freed = opt_.bytes.container(e.n + 1) - opt_.bytes.container(e.n);
    }
    idx.nodes -= 1;
    idx.bytes -= freed;
    return freed;
}

// match_length
int64_t TreeCore::match_length(int32_t node, const Gen& gen, int limit) const {
    int64_t m = 0, i = gen.n;
    int32_t x = node;
    while (m < limit) {
        const Node& n = nodes_[x];
        if (n.parent < 0) return i == 0 ? m + 1 : m;
        --i;
        if (i < 0 || n.token != gen.at(i)) return m;
        ++m;
        x = n.parent;
    }
    return m;
}

// SuffixIndex.matches
bool TreeCore::suffix_matches(const Index& idx, int list, const Gen& gen, int window, std::vector<int32_t>& out) const {
    int64_t need;
    const Key key = query_key(gen, window, &need);
    const int64_t at = find_slot(idx, key, key_hash(key));
    out.clear();
    if (at < 0) return false;
    const int64_t longest = std::min<int64_t>(opt_.max_match, gen.n + 1);
    const size_t cap = static_cast<size_t>(opt_.max_candidates);
    int64_t best = 0;
    int scanned = 0;
    for (int32_t x = idx.slots[at].tail; x >= 0 && scanned < opt_.scan_limit; x = link(x, list).prev, ++scanned) {
        if (!has_kids(x)) continue;
        const int64_t m = match_length(x, gen, opt_.max_match);
        if (m < need || m < best) continue;
        if (m > best) {
            best = m;
            out.assign(1, x);
        } else if (out.size() < cap) {
            out.push_back(x);
        }
        if (best == longest && out.size() == cap) break;  // older nodes can neither match longer nor displace
    }
    return !out.empty();
}

// TreeStore._draft_roots and _suffix_roots
void TreeCore::roots_for(const std::string& key, const std::string& task, const Gen& gen, const Cursor& cursor,
                         std::vector<int32_t>& roots, Source& source, bool& backoff) {
    roots.clear();
    backoff = false;
    int32_t state = cursor.state, node = cursor.node;
    if (state < 0) {
        auto it = state_of_.find(key);
        state = it == state_of_.end() ? -1 : it->second;
        if (state >= 0) node = locate(state, gen);
    }
    if (state >= 0) {
        touch(state);
        if (node >= 0 && has_kids(node)) {
            roots.push_back(node);
            source = kExact;
            return;
        }
    }
    // The task's own text first, the longer suffix first (see store.py).
    if (!task.empty()) {
        auto t = tasks_.find(task);
        if (t != tasks_.end()) {
            for (int i = 0; i < n_windows_; ++i) {
                if (suffix_matches(t->second->index[i], 2 * i + 1, gen, opt_.windows[i], roots)) {
                    source = kTask;
                    backoff = i > 0;
                    return;
                }
            }
        }
    }
    for (int i = 0; i < n_windows_; ++i) {
        if (suffix_matches(global_[i], 2 * i, gen, opt_.windows[i], roots)) {
            source = kGlobal;
            backoff = i > 0;
            return;
        }
    }
    source = kNone;
}

// ------------------------------------------------------------------ drafts (prefix_tree.select_draft)

namespace {
struct ItemLess {
    template <class I>
    bool operator()(const I& a, const I& b) const {
        if (a.negp != b.negp) return a.negp < b.negp;
        if (a.depth != b.depth) return a.depth < b.depth;
        if (a.parent != b.parent) return a.parent < b.parent;
        return a.token < b.token;
    }
};
struct ItemGreater {  // std's heaps are max-heaps: this comparator makes a min-heap
    template <class I>
    bool operator()(const I& a, const I& b) const {
        return ItemLess{}(b, a);
    }
};
}  // namespace

// _push_children: the (merged) children of `group`, at most the `limit` best, onto the frontier.
void TreeCore::push_children(const std::vector<int32_t>& group, double prob, int32_t depth, int32_t index,
                             size_t limit) {
    items_.clear();
    if (group.size() == 1) {
        const Node& n = nodes_[group[0]];
        if (!has_kids(group[0])) return;
        const double total = static_cast<double>(n.count - n.ends);
        for_children(group[0], [&](int32_t c) {
            const Node& k = nodes_[c];
            items_.push_back(Item{-(prob * (static_cast<double>(k.count) / total)), depth + 1, index, k.token,
                                  static_cast<int32_t>(arena_.size()), 1, k.live});
            arena_.push_back(c);
        });
    } else {
        // Merge the places' children by token (first-seen order; the heap's order is total anyway).
        std::vector<std::pair<int32_t, std::vector<int32_t>>> merged;
        int64_t total = 0;
        for (int32_t g : group) {
            if (!has_kids(g)) continue;
            total += nodes_[g].count - nodes_[g].ends;
            for_children(g, [&](int32_t c) {
                const int32_t t = nodes_[c].token;
                for (auto& m : merged) {
                    if (m.first == t) {
                        m.second.push_back(c);
                        return;
                    }
                }
                merged.emplace_back(t, std::vector<int32_t>{c});
            });
        }
        for (const auto& m : merged) {
            int64_t count = 0, live = 0;
            for (int32_t c : m.second) {
                count += nodes_[c].count;
                live += nodes_[c].live;
            }
            items_.push_back(Item{-(prob * (static_cast<double>(count) / static_cast<double>(total))), depth + 1,
                                  index, m.first, static_cast<int32_t>(arena_.size()),
                                  static_cast<int32_t>(m.second.size()), live});
            arena_.insert(arena_.end(), m.second.begin(), m.second.end());
        }
    }
    if (items_.size() > limit) {  // siblings below the `limit` best can never be chosen
        std::nth_element(items_.begin(), items_.begin() + static_cast<std::ptrdiff_t>(limit), items_.end(),
                         ItemLess{});
        items_.resize(limit);
    }
    for (const Item& it : items_) {
        heap_.push_back(it);
        std::push_heap(heap_.begin(), heap_.end(), ItemGreater{});
    }
}

void TreeCore::select(const std::vector<int32_t>& roots, int budget, Draft& out) {
    heap_.clear();
    arena_.clear();
    const size_t cap = static_cast<size_t>(budget);
    push_children(roots, 1.0, 0, -1, cap);
    while (!heap_.empty() && out.tokens.size() < cap) {
        std::pop_heap(heap_.begin(), heap_.end(), ItemGreater{});
        const Item top = heap_.back();
        heap_.pop_back();
        double negp = top.negp;
        int32_t depth = top.depth, parent = top.parent, token = top.token, gbeg = top.gbeg, glen = top.glen;
        int64_t live = top.live;
        int32_t single = glen == 1 ? arena_[gbeg] : -1;
        while (true) {
            const int32_t index = static_cast<int32_t>(out.tokens.size());
            out.tokens.push_back(token);
            out.parents.push_back(parent);
            out.probs.push_back(-negp);
            out.runahead.push_back(live == 0 ? 1 : 0);
            if (static_cast<size_t>(index) + 1 == cap) break;
            const size_t limit = cap - static_cast<size_t>(index) - 1;
            if (glen > 1) {  // several places merged: their children merge too
                group_.assign(arena_.begin() + gbeg, arena_.begin() + gbeg + glen);
                push_children(group_, -negp, depth, index, limit);
                break;
            }
            const Node& n = nodes_[single];
            if (n.map >= 0 || n.kid < 0) {  // a leaf, or two or more children
                if (n.map >= 0) {
                    group_.assign(1, single);
                    push_children(group_, -negp, depth, index, limit);
                }
                break;
            }
            // A chain (most of sampled text): the only child is chosen next unless the frontier
            // holds something better, so skip the heap round trip.
            const Node& k = nodes_[n.kid];
            const double next_p = negp * (static_cast<double>(k.count) / static_cast<double>(n.count - n.ends));
            if (!heap_.empty()) {
                const Item& best = heap_.front();
                if (next_p > best.negp || (next_p == best.negp && depth + 1 >= best.depth)) {
                    heap_.push_back(Item{next_p, depth + 1, index, k.token, static_cast<int32_t>(arena_.size()), 1,
                                         k.live});
                    arena_.push_back(n.kid);
                    std::push_heap(heap_.begin(), heap_.end(), ItemGreater{});
                    break;
                }
            }
            negp = next_p;
            depth += 1;
            parent = index;
            token = k.token;
            live = k.live;
            single = n.kid;
            glen = 1;
        }
    }
}

// TreeCache.draft / _select
void TreeCore::draft(const std::string& key, const std::string& task, const Gen& gen, const Cursor& cursor, int budget,
                     Draft& out) {
    out.clear();
    Source source = kNone;
    bool backoff = false;
    roots_.clear();
    if (budget > 0) roots_for(key, task, gen, cursor, roots_, source, backoff);
    if (roots_.empty()) {
        counts_[kDraftsNone] += 1;
        return;
    }
    select(roots_, budget, out);
    out.source = source;
    out.backoff = backoff;
    counts_[source == kExact ? kDraftsExact : source == kTask ? kDraftsTask : kDraftsGlobal] += 1;
    counts_[kNodesServed] += static_cast<int64_t>(out.tokens.size());
    int64_t ahead = 0;
    for (uint8_t r : out.runahead) ahead += r;
    counts_[kRunaheadServed] += ahead;
}

// ------------------------------------------------------------------ size (store.py)

void TreeCore::enforce_budget() {
    while (bytes_ > opt_.byte_budget && lru_head_ >= 0) evict_lru();
}

// TreeStore._evict_lru
std::string TreeCore::evict_lru() {
    if (lru_head_ < 0) throw std::logic_error("tree cache: nothing to evict");
    const int32_t s = lru_head_;
    const std::string key = states_[s].key;
    Task* task = states_[s].task;
    const std::vector<int32_t> nodes = subtree(states_[s].root);
    for (int32_t x : nodes) {
        for (int i = 0; i < n_windows_; ++i) {
            const Key k = node_key(x, opt_.windows[i]);
            bytes_ -= index_remove(global_[i], 2 * i, k, x);
            if (task) bytes_ -= index_remove(task->index[i], 2 * i + 1, k, x);
        }
    }
    for (int32_t x : nodes) free_node(x);
    if (task && task->index[0].nodes == 0) {
        const std::string name = task->name;  // erase() destroys the task, whose name the key refers to
        tasks_.erase(name);
        bytes_ -= opt_.bytes.task * n_windows_;
    }
    for (int32_t id : states_[s].streams) {  // they stop feeding the cache; their tokens go
        Stream& st = streams_[id];
        bytes_ -= opt_.bytes.stream_token * static_cast<int64_t>(st.tokens.size());
        st.state = st.node = -1;
        st.tokens = {};
    }
    bytes_ -= states_[s].bytes;
    n_nodes_ -= states_[s].nodes;
    counts_[kEvictions] += 1;
    lru_unlink(s);
    state_of_.erase(key);
    states_[s] = State{};
    free_states_.push_back(s);
    return key;
}

std::vector<std::string> TreeCore::state_keys() const {
    std::vector<std::string> out;
    for (int32_t s = lru_head_; s >= 0; s = states_[s].next) out.push_back(states_[s].key);
    return out;
}

// ------------------------------------------------------------------ persistence (persistence.py)

std::vector<TreeRows> TreeCore::export_trees() const {
    std::vector<TreeRows> out;
    std::vector<int32_t> row_of(nodes_.size(), -1);
    for (int32_t s = lru_head_; s >= 0; s = states_[s].next) {
        TreeRows rows;
        rows.key = states_[s].key;
        rows.task = states_[s].task ? states_[s].task->name : std::string();
        const std::vector<int32_t> order = subtree(states_[s].root);
        for (size_t i = 0; i < order.size(); ++i) {
            const Node& n = nodes_[order[i]];
            row_of[order[i]] = static_cast<int32_t>(i);
            rows.parents.push_back(n.parent >= 0 ? row_of[n.parent] : -1);
            rows.tokens.push_back(n.token);
            rows.counts.push_back(n.count);
            rows.ends.push_back(n.ends);
            rows.live.push_back(n.live);
            rows.ticks.push_back(n.tick);
        }
        out.push_back(std::move(rows));
    }
    return out;
}

void TreeCore::import_tree(const TreeRows& rows) {
    const size_t n = rows.tokens.size();
    if (n == 0 || rows.parents.size() != n || rows.counts.size() != n || rows.ends.size() != n ||
        rows.live.size() != n || rows.ticks.size() != n)
        throw std::invalid_argument("state '" + rows.key + "': its arrays differ in length or are empty");
    if (state_of_.count(rows.key)) throw std::invalid_argument("state '" + rows.key + "' is saved twice");
    if (rows.parents[0] != -1 || rows.tokens[0] != kSentinel)
        throw std::invalid_argument("state '" + rows.key + "': row 0 is not a root");
    std::vector<int32_t> ids(n);
    for (size_t i = 0; i < n; ++i) {
        const int32_t p = rows.parents[i];
        const int64_t t = rows.tokens[i];
        if (i > 0 && (p < 0 || static_cast<size_t>(p) >= i || t < 0 || t > INT32_MAX))
            throw std::invalid_argument("state '" + rows.key + "': bad parent link or token id at row " +
                                        std::to_string(i));
        const int32_t parent = i ? ids[p] : -1;
        if (i && child(parent, static_cast<int32_t>(t)) >= 0)
            throw std::invalid_argument("state '" + rows.key + "': two children with token " + std::to_string(t));
        ids[i] = new_node(static_cast<int32_t>(t), parent, rows.ticks[i]);
        Node& x = nodes_[ids[i]];
        x.count = rows.counts[i];
        x.ends = rows.ends[i];
        x.live = rows.live[i];
        if (i) add_child(parent, ids[i]);
    }
    adopt(rows.key, rows.task, ids[0]);
}

void TreeCore::index_all() {
    struct Item {
        int64_t tick;
        int32_t node, state;
    };
    std::vector<Item> every;
    for (int32_t s = lru_head_; s >= 0; s = states_[s].next)
        for (int32_t x : subtree(states_[s].root)) every.push_back(Item{nodes_[x].tick, x, s});
    std::stable_sort(every.begin(), every.end(), [](const Item& a, const Item& b) { return a.tick < b.tick; });
    for (const Item& e : every) index_node(e.state, e.node, nullptr);
    if (!every.empty()) tick_ = std::max(tick_, every.back().tick + 1);
}

// ------------------------------------------------------------------ integrity (integrity.py)

void TreeCore::check_tree(int32_t s, std::vector<std::string>& problems) const {
    const State& st = states_[s];
    const std::string name = "state '" + st.key + "'";
    const Node& root = nodes_[st.root];
    if (root.parent != -1 || root.token != kSentinel) problems.push_back(name + ": the root is not a root");
    for (int32_t x : subtree(st.root)) {
        const Node& n = nodes_[x];
        const std::string where = name + ": node " + std::to_string(x);
        if (n.map >= 0 && maps_[n.map].items.size() < 2) problems.push_back(where + " keeps < 2 children in a map");
        int64_t below = 0, live_below = 0;
        for_children(x, [&](int32_t c) {
            below += nodes_[c].count;
            live_below += nodes_[c].live;
            if (nodes_[c].parent != x) problems.push_back(where + ": a child does not point back to it");
            if (nodes_[c].tick <= n.tick) problems.push_back(where + ": a child's tick is not above its own");
            if (child(x, nodes_[c].token) != c) problems.push_back(where + ": a child is filed under another token");
        });
        if (n.count != below + n.ends || n.ends < 0)
            problems.push_back(where + ": count " + std::to_string(n.count) + " != children's " +
                               std::to_string(below) + " + ends " + std::to_string(n.ends));
        if (x != st.root && n.count < 1) problems.push_back(where + ": count < 1");
        if (!(live_below <= n.live && n.live <= n.count) || n.live - live_below > n.ends)
            problems.push_back(where + ": live " + std::to_string(n.live) + " out of bounds");
        if (problems.size() > 20) return;
    }
}

std::vector<std::string> TreeCore::problems() const {
    const ByteModel& b = opt_.bytes;
    std::vector<std::string> out;
    std::vector<int32_t> owner(nodes_.size(), -1);  // each held node's state
    int64_t total_nodes = 0, total_bytes = 0;
    std::unordered_map<const Task*, int64_t> task_nodes;
    size_t listed = 0;
    for (int32_t s = lru_head_, prev = -1; s >= 0; prev = s, s = states_[s].next) {
        const State& st = states_[s];
        ++listed;
        if (st.prev != prev) out.push_back("the LRU list's links are broken at state '" + st.key + "'");
        auto it = state_of_.find(st.key);
        if (it == state_of_.end() || it->second != s) out.push_back("state '" + st.key + "' is not filed by its key");
        check_tree(s, out);
        int64_t n = 0, tree = 0;
        for (int32_t x : subtree(st.root)) {
            if (owner[x] >= 0) out.push_back("node " + std::to_string(x) + " is in two trees");
            owner[x] = s;
            ++n;
            tree += b.node + b.container(n_children(x));
        }
        if (n != st.nodes || b.state + tree != st.bytes)
            out.push_back("state '" + st.key + "': holds " + std::to_string(n) + " nodes / " +
                          std::to_string(b.state + tree) + " bytes, its counters say " + std::to_string(st.nodes) +
                          " / " + std::to_string(st.bytes));
        total_nodes += n;
        total_bytes += b.state + tree;
        if (st.task) task_nodes[st.task] += n;
        for (int32_t id : st.streams) {
            auto f = stream_of_.find(streams_[id].id);
            if (f == stream_of_.end() || f->second != id || streams_[id].state != s)
                out.push_back("state '" + st.key + "' lists a stream that is not in flight from it");
        }
    }
    if (listed != state_of_.size()) out.push_back("the LRU list and the state table differ in size");
    for (const auto& [sid, id] : stream_of_) {
        const Stream& st = streams_[id];
        const std::string name = "stream '" + sid + "'";
        total_bytes += b.stream + b.stream_token * static_cast<int64_t>(st.tokens.size());
        if (st.id != sid) out.push_back(name + ": filed under the wrong id");
        if (st.state < 0) {
            if (st.node >= 0 || !st.tokens.empty()) out.push_back(name + ": detached but holds a cursor or tokens");
            continue;
        }
        const State& state = states_[st.state];
        auto it = state_of_.find(st.key);
        if (it == state_of_.end() || it->second != st.state ||
            std::find(state.streams.begin(), state.streams.end(), id) == state.streams.end()) {
            out.push_back(name + ": its state is not held, or does not list it");
            continue;
        }
        int32_t node = state.root;
        for (int32_t t : st.tokens) node = node >= 0 ? child(node, t) : -1;
        if (node < 0 || node != st.node) {
            out.push_back(name + ": its tokens do not walk to its cursor");
            continue;
        }
        if (nodes_[node].ends < 1 || (st.live && nodes_[node].live < 1))
            out.push_back(name + ": its cursor node counts no sequence ending there");
    }
    if (total_nodes != n_nodes_) out.push_back("node counter " + std::to_string(n_nodes_) + " != nodes held");
    // Every index: each listed node is held (by a state of the index's task), filed under its own key,
    // once, in creation order; the counts and bytes add up.
    auto check_index = [&](const Index& idx, int list, int window, const Task* task, int64_t expected,
                           const std::string& name) {
        std::vector<uint8_t> seen(nodes_.size(), 0);
        int64_t count = 0, bytes = 0;
        int64_t keys = 0;
        for (size_t at = 0; at < idx.slots.size(); ++at) {
            const Slot& e = idx.slots[at];
            if (e.head < 0) continue;
            ++keys;
            if (e.head >= static_cast<int32_t>(nodes_.size()) || owner[e.head] < 0) {
                out.push_back(name + ": a key's oldest node is not held");
                continue;
            }
            const Key key = node_key(e.head, window);
            if (e.hash != key_hash(key) || find_slot(idx, key, e.hash) != static_cast<int64_t>(at))
                out.push_back(name + ": a key is filed under the wrong hash or cannot be found");
            int64_t n = 0, last_tick = -1;
            int32_t prev = -1;
            for (int32_t x = e.head; x >= 0; prev = x, x = link(x, list).next) {
                ++n;
                if (link(x, list).prev != prev) out.push_back(name + ": broken links");
                if (owner[x] < 0 || (task && states_[owner[x]].task != task) || seen[x]) {
                    out.push_back(name + ": lists node " + std::to_string(x) + ", which it should not");
                    break;
                }
                seen[x] = 1;
                if (!(node_key(x, window) == key)) out.push_back(name + ": a node is filed under another key");
                if (nodes_[x].tick <= last_tick) out.push_back(name + ": a key's nodes are out of creation order");
                last_tick = nodes_[x].tick;
                if (n > e.n) break;
            }
            if (n != e.n || prev != e.tail) out.push_back(name + ": a key's node count or tail is wrong");
            count += n;
            bytes += b.index_key + b.container(n);
        }
        if (keys != idx.keys || static_cast<size_t>(2 * keys) > idx.slots.size())
            out.push_back(name + ": its key count is wrong or its table is over half full");
        if (count != expected || idx.nodes != expected)
            out.push_back(name + ": holds " + std::to_string(count) + " nodes (counter " + std::to_string(idx.nodes) +
                          "), expected " + std::to_string(expected));
        if (bytes != idx.bytes) out.push_back(name + ": byte counter " + std::to_string(idx.bytes) + " != recomputed");
        total_bytes += idx.bytes;
    };
    for (int i = 0; i < n_windows_; ++i)
        check_index(global_[i], 2 * i, opt_.windows[i], nullptr, total_nodes,
                    "global index (window " + std::to_string(opt_.windows[i]) + ")");
    if (task_nodes.size() != tasks_.size()) out.push_back("task indexes differ from the tasks of held states");
    for (const auto& [name, task] : tasks_) {
        auto f = task_nodes.find(task.get());
        const int64_t expected = f == task_nodes.end() ? 0 : f->second;
        for (int i = 0; i < n_windows_; ++i)
            check_index(task->index[i], 2 * i + 1, opt_.windows[i], task.get(), expected,
                        "task '" + name + "' index (window " + std::to_string(opt_.windows[i]) + ")");
        total_bytes += b.task * n_windows_;
    }
    if (total_bytes != bytes_)
        out.push_back("byte counter " + std::to_string(bytes_) + " != " + std::to_string(total_bytes) + " recomputed");
    if (bytes_ > opt_.byte_budget && lru_head_ >= 0) out.push_back("over the byte budget with states left");
    std::vector<int64_t> ticks;
    for (size_t x = 0; x < owner.size(); ++x)
        if (owner[x] >= 0) ticks.push_back(nodes_[x].tick);
    std::sort(ticks.begin(), ticks.end());
    if (std::adjacent_find(ticks.begin(), ticks.end()) != ticks.end() || (!ticks.empty() && ticks.back() >= tick_))
        out.push_back("node ticks are not unique or not below the next tick");
    return out;
}

// ------------------------------------------------------------------ SGLang's layout (layout.flat_tree)

void flat_layout(const Draft& draft, int64_t root, int width, int64_t vocab_size, int64_t* tokens, int64_t* mask) {
    if (width < 1) throw std::invalid_argument("width must be >= 1 (the root)");
    const int keep = std::min<int>(static_cast<int>(draft.tokens.size()), width - 1);
    std::vector<int> depth(keep), order(keep), slot(keep);
    for (int i = 0; i < keep; ++i) {
        const int p = draft.parents[i];
        depth[i] = p < 0 ? 1 : depth[p] + 1;
        order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return depth[a] < depth[b]; });
    for (int k = 0; k < keep; ++k) slot[order[k]] = k + 1;
    std::vector<int64_t> toks{root};
    std::vector<int> parents{-1};
    for (int k = 0; k < keep; ++k) {
        const int i = order[k];
        toks.push_back(draft.tokens[i]);
        parents.push_back(draft.parents[i] < 0 ? 0 : slot[draft.parents[i]]);
    }
    const int pads = width - 1 - keep;
    if (pads > 0) {
        std::vector<int64_t> used;
        for (size_t k = 1; k < toks.size(); ++k)
            if (parents[k] == 0) used.push_back(toks[k]);
        std::sort(used.begin(), used.end());
        used.erase(std::unique(used.begin(), used.end()), used.end());
        if (vocab_size - static_cast<int64_t>(used.size()) < pads)
            throw std::invalid_argument("vocabulary of " + std::to_string(vocab_size) + " has too few tokens for " +
                                        std::to_string(pads) + " distinct pads");
        std::vector<int64_t> fresh;  // the smallest ids no root child has
        for (int64_t t = 0; static_cast<int>(fresh.size()) < pads; ++t)
            if (!std::binary_search(used.begin(), used.end(), t)) fresh.push_back(t);
        size_t first_deeper = 1;
        while (first_deeper < toks.size() && parents[first_deeper] == 0) ++first_deeper;
        // Pads go after the real root children (still breadth-first); deeper slots shift by `pads`.
        for (size_t k = 1; k < parents.size(); ++k)
            if (parents[k] >= static_cast<int>(first_deeper)) parents[k] += pads;
        toks.insert(toks.begin() + static_cast<std::ptrdiff_t>(first_deeper), fresh.begin(), fresh.end());
        parents.insert(parents.begin() + static_cast<std::ptrdiff_t>(first_deeper), static_cast<size_t>(pads), 0);
    }
    std::fill(mask, mask + static_cast<size_t>(width) * width, 0);
    for (int i = 0; i < width; ++i) {
        tokens[i] = toks[i];
        for (int j = i; j >= 0; j = parents[j]) mask[static_cast<size_t>(i) * width + j] = 1;
    }
}

}  // namespace srt
