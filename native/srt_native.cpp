// srt-agent's native core: the per-step host work of speculative decoding, in C++.
//
// Each function here has a Python twin (the reference; `SRT_NATIVE=0` runs it) and a test that
// checks both give identical results. They run once per engine step over every row, where the
// Python versions spend about a microsecond per drafted token on object and list work.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

void bind_tree_core(py::module_& m);  // tree_core_py.cpp

namespace {

// A borrowed view of a Python list or tuple (PySequence_Fast), owning its reference.
class Seq {
public:
    explicit Seq(py::handle obj, const char* what) {
        fast_ = PySequence_Fast(obj.ptr(), what);
        if (fast_ == nullptr) throw py::error_already_set();
        size_ = PySequence_Fast_GET_SIZE(fast_);
        items_ = PySequence_Fast_ITEMS(fast_);
    }
    Seq(const Seq&) = delete;
    Seq& operator=(const Seq&) = delete;
    ~Seq() { Py_XDECREF(fast_); }
    Py_ssize_t size() const { return size_; }
    PyObject* operator[](Py_ssize_t i) const { return items_[i]; }
    int64_t integer(Py_ssize_t i) const {
        int64_t v = PyLong_AsLongLong(items_[i]);
        if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
        return v;
    }
    double real(Py_ssize_t i) const {
        double v = PyFloat_AsDouble(items_[i]);
        if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
        return v;
    }

private:
    PyObject* fast_ = nullptr;
    Py_ssize_t size_ = 0;
    PyObject** items_ = nullptr;
};

// The inputs of a static tree step (see srt_agent.engine.step_graphs): per row its tokens, each
// position's ancestor bitmask and depth, the rows' cached lengths, and each position's uniform.
// Rows past the given ones (padding) and positions past a row's tree chain onto the previous
// position. Returns how many integers and floats were written.
py::tuple tree_layout(py::handle ids, py::handle parents, py::handle uniforms, py::handle prefix, int64_t bb,
                      int64_t tb, py::array_t<int64_t, py::array::c_style> ints,
                      py::array_t<float, py::array::c_style> floats) {
    if (tb < 1 || tb > 62) throw std::invalid_argument("tree width must be in [1, 62], got " + std::to_string(tb));
    const Seq rows(ids, "ids must be a sequence of rows");
    const Seq ups(parents, "parents must be a sequence of rows");
    const Seq pre(prefix, "prefix must be a sequence");
    const bool has_u = !uniforms.is_none();
    const int64_t n = bb * tb;
    if (rows.size() > bb || ups.size() < rows.size() || pre.size() != rows.size())
        throw std::invalid_argument("tree_layout: rows, parents and prefix do not match the bucket");
    if (ints.size() < 3 * n + bb || floats.size() < n) throw std::invalid_argument("tree_layout: buffers too small");
    int64_t* out = ints.mutable_data();
    float* fout = floats.mutable_data();
    int64_t* masks = out + n;
    int64_t* depths = out + 2 * n;
    std::optional<Seq> all_u;
    if (has_u) all_u.emplace(uniforms, "uniforms must be a sequence of rows");
    std::vector<int64_t> up_row;
    std::vector<double> us;
    for (int64_t b = 0; b < bb; ++b) {
        const bool real = b < rows.size();
        Py_ssize_t len = 0;
        up_row.clear();
        if (real) {
            const Seq row(rows[b], "a row of ids must be a sequence");
            const Seq up(ups[b], "a row of parents must be a sequence");
            len = row.size();
            if (len > tb) throw std::invalid_argument("tree_layout: a row is wider than the bucket");
            for (Py_ssize_t j = 0; j < len; ++j) {
                out[b * tb + j] = row.integer(j);
                up_row.push_back(j < up.size() ? up.integer(j) : -1);
            }
        }
        for (int64_t j = 0; j < tb; ++j) {
            // Past the row's tree (and in padding rows) positions chain onto the previous one.
            const int64_t parent = j < len ? up_row[j] : j - 1;
            if (parent >= j) throw std::invalid_argument("tree_layout: a parent must precede its child");
            masks[b * tb + j] = (parent >= 0 ? masks[b * tb + parent] : 0) | (int64_t{1} << j);
            depths[b * tb + j] = parent >= 0 ? depths[b * tb + parent] + 1 : 0;
        }
        for (int64_t j = len; j < tb; ++j) out[b * tb + j] = 0;
        us.assign(1, 0.5);
        if (real && has_u) {
            const Seq row_u((*all_u)[b], "a row of uniforms must be a sequence");
            if (row_u.size() == 0) throw std::invalid_argument("tree_layout: a row has no uniforms");
            us.resize(row_u.size());
            for (Py_ssize_t k = 0; k < row_u.size(); ++k) us[k] = row_u.real(k);
        }
        const int64_t last = static_cast<int64_t>(us.size()) - 1;
        for (int64_t j = 0; j < tb; ++j)
            fout[b * tb + j] = static_cast<float>(us[std::min(depths[b * tb + j], last)]);
        out[3 * n + b] = real ? pre.integer(b) : 0;
    }
    return py::make_tuple(3 * n + bb, n);
}

// Per node of a draft: its probability capped by its ancestors' (clipped to [0, 1]), its depth
// (1 = child of the root) and its parent; the cost model's ranking and calibration read these.
struct DraftStats {
    std::vector<double> q;
    std::vector<int64_t> depth, parent;

    DraftStats(py::handle probs, py::handle parents) {
        const Seq p(probs, "probs must be a sequence");
        const Seq up(parents, "parents must be a sequence");
        const Py_ssize_t n = p.size();
        if (up.size() != n) throw std::invalid_argument("a draft's probs and parents differ in length");
        q.resize(n);
        depth.resize(n);
        parent.resize(n);
        for (Py_ssize_t j = 0; j < n; ++j) {
            const double value = std::max(0.0, std::min(1.0, p.real(j)));
            const int64_t pj = up.integer(j);
            if (pj >= j || pj < -1) throw std::invalid_argument("a draft node's parent must precede it");
            parent[j] = pj;
            q[j] = pj >= 0 ? std::min(value, q[pj]) : value;
            depth[j] = pj >= 0 ? depth[pj] + 1 : 1;
        }
    }
    Py_ssize_t size() const { return static_cast<Py_ssize_t>(q.size()); }
};

// The cost model's ranking of one draft's nodes (see CostModel.rank): the order (by capped
// probability, then depth, then index) and each node's expected acceptance, min(1, rate * q)
// capped by its parent's. ``rates[d - 1]``: the calibration factor at depth d.
py::tuple rank_nodes(const DraftStats& st, py::handle rates) {
    const Seq r(rates, "rates must be a sequence");
    const Py_ssize_t n = st.size();
    std::vector<double> values(n);
    bool ranked = true;
    double last_q = 2.0;
    int64_t last_d = 0;
    for (Py_ssize_t j = 0; j < n; ++j) {
        const double qj = st.q[j];
        const int64_t dj = st.depth[j];
        if (dj > r.size()) throw std::invalid_argument("rank_many: no rate for a node's depth");
        const double v = std::min(1.0, r.real(dj - 1) * qj);
        values[j] = st.parent[j] >= 0 ? std::min(v, values[st.parent[j]]) : v;
        if (qj > last_q || (qj == last_q && dj < last_d)) ranked = false;
        last_q = qj;
        last_d = dj;
    }
    std::vector<Py_ssize_t> order(n);
    for (Py_ssize_t j = 0; j < n; ++j) order[j] = j;
    if (!ranked) {
        std::sort(order.begin(), order.end(), [&](Py_ssize_t a, Py_ssize_t b) {
            if (st.q[a] != st.q[b]) return st.q[a] > st.q[b];
            if (st.depth[a] != st.depth[b]) return st.depth[a] < st.depth[b];
            return a < b;
        });
    }
    py::tuple out_order(n), out_values(n);
    for (Py_ssize_t i = 0; i < n; ++i) {
        out_order[i] = py::int_(order[i]);
        out_values[i] = py::float_(values[order[i]]);
    }
    return py::make_tuple(out_order, out_values);
}

// The ranking of every row's draft of a step: ``drafts`` (objects with ``probs`` and
// ``parents``) and per row its rates by depth.
py::list rank_many(py::handle drafts, py::handle rates) {
    const Seq ds(drafts, "drafts must be a sequence");
    const Seq rs(rates, "rates must be a sequence of rows");
    if (rs.size() != ds.size()) throw std::invalid_argument("rank_many: one rates row per draft");
    py::list out;
    for (Py_ssize_t i = 0; i < ds.size(); ++i) {
        const py::handle draft(ds[i]);
        out.append(rank_nodes(DraftStats(draft.attr("probs"), draft.attr("parents")), rs[i]));
    }
    return out;
}

// One verify step's evidence for the acceptance calibration from one draft: per depth (1 =
// child of the root, ascending), the nodes verified, the sum of their capped probabilities (in
// node order) and how many were accepted. ``accepted``: the accepted node indices.
py::list depth_sums(py::handle probs, py::handle parents, py::handle accepted) {
    const DraftStats st(probs, parents);
    const Seq acc(accepted, "accepted must be a sequence");
    const Py_ssize_t n = st.size();
    std::vector<char> taken(n, 0);
    for (Py_ssize_t i = 0; i < acc.size(); ++i) {
        const int64_t j = acc.integer(i);
        if (j < 0 || j >= n) throw std::invalid_argument("depth_sums: an accepted index is out of range");
        taken[j] = 1;
    }
    int64_t deepest = 0;
    for (Py_ssize_t j = 0; j < n; ++j) deepest = std::max(deepest, st.depth[j]);
    std::vector<int64_t> nodes(deepest + 1, 0), hits(deepest + 1, 0);
    std::vector<double> mass(deepest + 1, 0.0);
    for (Py_ssize_t j = 0; j < n; ++j) {
        nodes[st.depth[j]] += 1;
        mass[st.depth[j]] += st.q[j];
        hits[st.depth[j]] += taken[j];
    }
    py::list out;
    for (int64_t d = 1; d <= deepest; ++d)
        if (nodes[d] > 0) out.append(py::make_tuple(d, nodes[d], mass[d], hits[d]));
    return out;
}

// The acceptance walk of every row of a verify step whose draws were made at every tree position
// (see srt_agent.engine.speculation.verify): from the root, emit the token drawn at the current
// position; descend into the draft node under the current one that carries it, or stop. Per
// row: (accepted node indices, emitted tokens, the positions they were drawn at, their logprobs).
py::list walk_drawn(py::handle token_ids, py::handle parents, py::handle drawn, py::handle logprobs) {
    const Seq toks(token_ids, "token_ids must be a sequence of rows");
    const Seq ups(parents, "parents must be a sequence of rows");
    const Seq draws(drawn, "drawn must be a sequence of rows");
    const Seq lps(logprobs, "logprobs must be a sequence of rows");
    const Py_ssize_t rows = toks.size();
    if (ups.size() != rows || draws.size() != rows || lps.size() != rows)
        throw std::invalid_argument("walk_drawn: token_ids, parents, drawn and logprobs differ in rows");
    py::list out;
    std::vector<int64_t> tok, up;
    for (Py_ssize_t b = 0; b < rows; ++b) {
        const Seq t(toks[b], "a row of token ids must be a sequence");
        const Seq p(ups[b], "a row of parents must be a sequence");
        const Seq d(draws[b], "a row of draws must be a sequence");
        const Seq l(lps[b], "a row of logprobs must be a sequence");
        const Py_ssize_t n = t.size();
        if (p.size() != n) throw std::invalid_argument("walk_drawn: a row's token ids and parents differ");
        if (d.size() < n + 1 || l.size() < n + 1)
            throw std::invalid_argument("walk_drawn: a row has fewer draws than tree positions");
        tok.resize(n);
        up.resize(n);
        for (Py_ssize_t j = 0; j < n; ++j) {
            tok[j] = t.integer(j);
            up[j] = p.integer(j);
        }
        py::list accepted, tokens, positions, row_lps;
        int64_t node = -1;
        while (true) {
            const Py_ssize_t position = node + 1;
            const int64_t token = d.integer(position);
            tokens.append(py::int_(token));
            positions.append(py::int_(position));
            row_lps.append(l[position]);
            int64_t next = -1;
            for (Py_ssize_t j = 0; j < n; ++j)  // siblings are distinct; the last match, as a dict keeps
                if (up[j] == node && tok[j] == token) next = j;
            if (next < 0) break;
            accepted.append(py::int_(next));
            node = next;
        }
        out.append(py::make_tuple(py::tuple(accepted), py::tuple(tokens), py::tuple(positions), row_lps));
    }
    return out;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    bind_tree_core(m);
    m.doc() = "srt-agent's native core (C++): per-step host work of speculative decoding.";
    m.def("tree_layout", &tree_layout, py::arg("ids"), py::arg("parents"), py::arg("uniforms"), py::arg("prefix"),
          py::arg("bb"), py::arg("tb"), py::arg("ints"), py::arg("floats"),
          "Write a static tree step's inputs into the buffers; returns (integers, floats) written.");
    m.def("rank_many", &rank_many, py::arg("drafts"), py::arg("rates"),
          "Every row's draft ranked as the cost model ranks it: (node order, expected acceptances).");
    m.def("depth_sums", &depth_sums, py::arg("probs"), py::arg("parents"), py::arg("accepted"),
          "Per depth of a verified draft: (depth, nodes, sum of capped probabilities, accepted).");
    m.def("walk_drawn", &walk_drawn, py::arg("token_ids"), py::arg("parents"), py::arg("drawn"), py::arg("logprobs"),
          "Every row's acceptance walk over draws made at every tree position.");
}
