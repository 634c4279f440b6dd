// Python bindings of the tree cache's core (srt_agent._native.TreeCore).
//
// The engine calls draft_many and extend_many once per step with every row's queries or updates
// (srt_agent.contracts.draft.DraftQuery / StreamUpdate tuples); they are read here without
// building Python objects per token, and drafts come back as DraftTree objects built directly.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <climits>
#include <memory>
#include <string>
#include <vector>

#include "tree_core.h"

namespace py = pybind11;

namespace {

std::string utf8(PyObject* s, const char* what) {
    Py_ssize_t n = 0;
    const char* data = PyUnicode_Check(s) ? PyUnicode_AsUTF8AndSize(s, &n) : nullptr;
    if (data == nullptr) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s must be a str", what);
        throw py::error_already_set();
    }
    return std::string(data, static_cast<size_t>(n));
}

std::string repr(const std::string& s) { return py::repr(py::str(s)).cast<std::string>(); }

// A Python list or tuple (PySequence_Fast), owning its reference.
class Fast {
public:
    // Lists and tuples, subclasses included (DraftQuery is a NamedTuple), are read in place;
    // PySequence_Fast would copy a subclass into a new tuple.
    Fast(PyObject* obj, const char* what) {
        if (PyList_Check(obj) || PyTuple_Check(obj)) {
            Py_INCREF(obj);
            obj_ = obj;
        } else {
            obj_ = PySequence_Fast(obj, what);
            if (obj_ == nullptr) throw py::error_already_set();
        }
    }
    Fast(const Fast&) = delete;
    Fast& operator=(const Fast&) = delete;
    ~Fast() { Py_DECREF(obj_); }
    Py_ssize_t size() const { return PySequence_Fast_GET_SIZE(obj_); }
    PyObject* operator[](Py_ssize_t i) const { return PySequence_Fast_ITEMS(obj_)[i]; }
    int64_t integer(Py_ssize_t i) const {
        const long long v = PyLong_AsLongLong((*this)[i]);
        if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
        return v;
    }

private:
    PyObject* obj_ = nullptr;
};

// Tokens [lo, n) of a sequence as int32 (ids past int32 are refused: vocabularies are smaller).
void tokens_of(const Fast& seq, Py_ssize_t lo, std::vector<int32_t>& out, int64_t* lowest) {
    const Py_ssize_t n = seq.size();
    out.resize(static_cast<size_t>(n - lo));
    int64_t low = INT64_MAX;
    for (Py_ssize_t i = lo; i < n; ++i) {
        const int64_t v = seq.integer(i);
        if (v > INT32_MAX) throw py::value_error("token id " + std::to_string(v) + " is past 2**31 - 1");
        low = std::min(low, v);
        out[static_cast<size_t>(i - lo)] = static_cast<int32_t>(v);
    }
    if (lowest) *lowest = low;
}

// Builds DraftTree objects without their __init__ checks (valid by construction, as
// DraftTree.trusted), setting the frozen dataclass's fields as object.__setattr__ does.
class TreeMaker {
public:
    TreeMaker(py::handle cls, py::handle empty)
        : cls_(py::reinterpret_borrow<py::object>(cls)), empty_(py::reinterpret_borrow<py::object>(empty)) {
        static const char* names[] = {"token_ids", "parents", "probs", "source", "runahead", "backoff"};
        for (int i = 0; i < 6; ++i) names_[i] = py::reinterpret_steal<py::object>(PyUnicode_InternFromString(names[i]));
        sources_[srt::kExact] = py::str("exact");
        sources_[srt::kTask] = py::str("task");
        sources_[srt::kGlobal] = py::str("global");
    }

    bool for_(py::handle cls, py::handle empty) const { return cls.ptr() == cls_.ptr() && empty.ptr() == empty_.ptr(); }

    py::object make(const srt::Draft& d) const {
        if (d.tokens.empty()) return py::reinterpret_borrow<py::object>(empty_);
        const Py_ssize_t n = static_cast<Py_ssize_t>(d.tokens.size());
        py::tuple ids(n), parents(n), probs(n), ahead(n);
        for (Py_ssize_t i = 0; i < n; ++i) {
            PyTuple_SET_ITEM(ids.ptr(), i, PyLong_FromLong(d.tokens[i]));
            PyTuple_SET_ITEM(parents.ptr(), i, PyLong_FromLong(d.parents[i]));
            PyTuple_SET_ITEM(probs.ptr(), i, PyFloat_FromDouble(d.probs[i]));
            PyObject* flag = d.runahead[i] ? Py_True : Py_False;
            Py_INCREF(flag);
            PyTuple_SET_ITEM(ahead.ptr(), i, flag);
        }
        auto* type = reinterpret_cast<PyTypeObject*>(cls_.ptr());
        py::tuple no_args;
        py::object tree = py::reinterpret_steal<py::object>(PyBaseObject_Type.tp_new(type, no_args.ptr(), nullptr));
        if (!tree) throw py::error_already_set();
        const py::object values[6] = {ids, parents, probs, sources_[d.source], ahead, py::bool_(d.backoff)};
        for (int i = 0; i < 6; ++i)
            if (PyObject_GenericSetAttr(tree.ptr(), names_[i].ptr(), values[i].ptr()) < 0) throw py::error_already_set();
        return tree;
    }

private:
    py::object cls_, empty_;  // owned: the maker outlives a call
    py::object names_[6];
    py::object sources_[4];
};

class PyTreeCore {
public:
    PyTreeCore(std::vector<int> windows, int max_match, int scan_limit, int max_candidates, int64_t byte_budget,
               std::vector<int64_t> byte_model)
        : core_(options(std::move(windows), max_match, scan_limit, max_candidates, byte_budget, byte_model)) {}

    // Every query's draft (DraftQuery tuples: stream_id, state_key, task_id, prompt_ids, generated, budget).
    py::list draft_many(py::handle queries, py::handle cls, py::handle empty) {
        const Fast qs(queries.ptr(), "queries must be a sequence");
        const std::vector<int> budgets = budgets_of(qs);
        const TreeMaker& maker = maker_for(cls, empty);
        py::list out(qs.size());
        for (Py_ssize_t i = 0; i < qs.size(); ++i) {
            query(qs[i], budgets[i]);
            PyList_SET_ITEM(out.ptr(), i, maker.make(draft_).release().ptr());
        }
        return out;
    }

    // Every query's draft in SGLang's layout, written into `tokens` (rows x width) and `mask`
    // (rows x width x width), int64, without building DraftTree objects: the n-gram corpus's call.
    void draft_flat(py::handle queries, py::handle roots, int width, int64_t vocab_size,
                    py::array_t<int64_t, py::array::c_style> tokens, py::array_t<int64_t, py::array::c_style> mask) {
        const Fast qs(queries.ptr(), "queries must be a sequence");
        const Fast rs(roots.ptr(), "roots must be a sequence");
        const Py_ssize_t n = qs.size();
        if (width < 1) throw py::value_error("width must be >= 1 (the root), got " + std::to_string(width));
        if (rs.size() != n || tokens.size() < n * width || mask.size() < n * width * width)
            throw py::value_error("draft_flat: roots or buffers do not match the queries");
        const std::vector<int> budgets = budgets_of(qs);
        int64_t* tok = tokens.mutable_data();
        int64_t* msk = mask.mutable_data();
        for (Py_ssize_t i = 0; i < n; ++i) {
            query(qs[i], budgets[i]);
            try {
                srt::flat_layout(draft_, rs.integer(i), width, vocab_size, tok + i * width,
                                 msk + static_cast<size_t>(i) * width * width);
            } catch (const std::invalid_argument& exc) {
                throw py::value_error(exc.what());
            }
        }
    }

    py::object draft(const std::string& key, const std::string& task, py::handle generated, int budget,
                     py::handle cls, py::handle empty) {
        check_budget(budget);
        one(std::string(), key, task, generated.ptr(), budget);
        return maker_for(cls, empty).make(draft_);
    }

    // Every update's tokens (StreamUpdate tuples: stream_id, state_key, task_id, new_tokens, kind);
    // the valid ones are applied, then the budget enforced. Returns the invalid ones' messages.
    std::vector<std::string> extend_many(py::handle updates) {
        const Fast us(updates.ptr(), "updates must be a sequence");
        std::vector<std::string> errors;
        for (Py_ssize_t i = 0; i < us.size(); ++i) {
            const Fast u(us[i], "a stream update must be a tuple");
            if (u.size() < 4) throw py::type_error("a stream update has 4 or 5 fields");
            std::string error = extend_one(utf8(u[0], "stream_id"), utf8(u[1], "state_key"), utf8(u[2], "task_id"),
                                           u[3], u.size() > 4 ? u[4] : nullptr);
            if (!error.empty()) errors.push_back(std::move(error));
        }
        core_.enforce_budget();
        return errors;
    }

    void insert(const std::string& key, const std::string& task, py::handle tokens, bool live) {
        const Fast seq(tokens.ptr(), "tokens must be a sequence");
        int64_t low = 0;
        tokens_of(seq, 0, buf_, &low);
        if (seq.size() && low < 0)
            throw py::value_error("token ids must be >= 0, got " + std::to_string(low) + " (state " + repr(key) + ")");
        core_.insert(key, task, buf_.data(), static_cast<int64_t>(buf_.size()), live);
    }

    bool finish(const std::string& sid) { return core_.finish(sid); }
    void enforce_budget() { core_.enforce_budget(); }
    std::string evict_lru() { return core_.evict_lru(); }
    std::vector<std::string> state_keys() const { return core_.state_keys(); }
    bool has_state(const std::string& key) const { return core_.has_state(key); }
    py::tuple sizes() const { return py::make_tuple(core_.states(), core_.nodes(), core_.streams(), core_.bytes()); }
    std::vector<int64_t> counters() const {
        std::vector<int64_t> out;
        for (int i = 0; i < srt::kNumCounters; ++i) out.push_back(core_.counter(i));
        return out;
    }
    void set_counters(const std::vector<int64_t>& values) {
        if (values.size() != srt::kNumCounters) throw py::value_error("set_counters: wrong number of counters");
        for (int i = 0; i < srt::kNumCounters; ++i) core_.set_counter(i, values[i]);
    }
    int64_t next_tick() const { return core_.next_tick(); }
    void set_next_tick(int64_t t) { core_.set_next_tick(t); }

    py::list export_trees() const {
        py::list out;
        for (const srt::TreeRows& t : core_.export_trees()) {
            out.append(py::make_tuple(t.key, t.task, as_array(t.parents), as_array(t.tokens), as_array(t.counts),
                                      as_array(t.ends), as_array(t.live), as_array(t.ticks)));
        }
        return out;
    }

    void import_tree(const std::string& key, const std::string& task, py::array_t<int32_t, py::array::forcecast> parents,
                     py::array_t<int64_t, py::array::forcecast> tokens, py::array_t<int64_t, py::array::forcecast> counts,
                     py::array_t<int64_t, py::array::forcecast> ends, py::array_t<int64_t, py::array::forcecast> live,
                     py::array_t<int64_t, py::array::forcecast> ticks) {
        srt::TreeRows rows;
        rows.key = key;
        rows.task = task;
        rows.parents = to_vector(parents);
        rows.tokens = to_vector(tokens);
        rows.counts = to_vector(counts);
        rows.ends = to_vector(ends);
        rows.live = to_vector(live);
        rows.ticks = to_vector(ticks);
        try {
            core_.import_tree(rows);
        } catch (const std::invalid_argument& exc) {
            throw py::value_error(exc.what());
        }
    }

    void index_all() { core_.index_all(); }
    std::vector<std::string> problems() const { return core_.problems(); }

private:
    static srt::CoreOptions options(std::vector<int> windows, int max_match, int scan_limit, int max_candidates,
                                    int64_t byte_budget, const std::vector<int64_t>& m) {
        if (m.size() != 8) throw py::value_error("byte_model has 8 prices");
        srt::CoreOptions o;
        o.windows = std::move(windows);
        o.max_match = max_match;
        o.scan_limit = scan_limit;
        o.max_candidates = max_candidates;
        o.byte_budget = byte_budget;
        o.bytes = srt::ByteModel{m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7]};
        return o;
    }

    template <class T>
    static py::array_t<T> as_array(const std::vector<T>& v) {
        py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
        std::copy(v.begin(), v.end(), a.mutable_data());
        return a;
    }

    template <class T>
    static std::vector<T> to_vector(const py::array_t<T, py::array::forcecast>& a) {
        if (a.ndim() != 1) throw py::value_error("tree arrays must be one-dimensional");
        const T* p = a.data();
        return std::vector<T>(p, p + a.size());
    }

    static void check_budget(int64_t budget) {
        if (budget < 0)
            throw py::value_error("draft budget must be >= 0 (0 asks for no draft), got " + std::to_string(budget));
    }

    // Every query's budget, all checked before any draft is made (a bad one leaves the cache as is).
    static std::vector<int> budgets_of(const Fast& queries) {
        std::vector<int> out(static_cast<size_t>(queries.size()));
        for (Py_ssize_t i = 0; i < queries.size(); ++i) {
            const Fast q(queries[i], "a draft query must be a tuple");
            if (q.size() < 6) throw py::type_error("a draft query has 6 fields");
            const long long v = PyLong_AsLongLong(q[5]);
            if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
            check_budget(v);
            out[static_cast<size_t>(i)] = static_cast<int>(std::min<long long>(v, INT_MAX));
        }
        return out;
    }

    // A DraftQuery tuple's draft into draft_ (see one()).
    void query(PyObject* tuple, int budget) {
        const Fast q(tuple, "a draft query must be a tuple");
        one(utf8(q[0], "stream_id"), utf8(q[1], "state_key"), utf8(q[2], "task_id"), q[4], budget);
    }

    // One query's draft into draft_. The generated tokens are read only as far as the draft needs:
    // none when the stream's cursor serves it, the last max_match + 1 for a suffix match, all of
    // them only to walk a state's tree from its root.
    void one(const std::string& sid, const std::string& key, const std::string& task, PyObject* generated,
             int budget) {
        const Fast gen(generated, "generated must be a sequence");
        const Py_ssize_t n = gen.size();
        srt::Cursor cursor;
        srt::Gen g{nullptr, static_cast<int64_t>(n), static_cast<int64_t>(n)};
        if (budget > 0) {
            if (!sid.empty()) cursor = core_.cursor(sid, key, n, n ? static_cast<int32_t>(gen.integer(n - 1)) : -1);
            if (!cursor.has_kids) {
                const bool walk = cursor.node < 0 && core_.has_state(key);
                const Py_ssize_t lo = walk ? 0 : std::max<Py_ssize_t>(0, n - (core_.options().max_match + 1));
                tokens_of(gen, lo, buf_, nullptr);
                g = srt::Gen{buf_.data(), static_cast<int64_t>(n), static_cast<int64_t>(lo)};
            }
        }
        core_.draft(key, task, g, cursor, budget, draft_);
    }

    std::string extend_one(const std::string& sid, const std::string& key, const std::string& task,
                           PyObject* tokens, PyObject* kind) {
        bool live = true;
        if (kind != nullptr) {
            const bool is_live = PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "live") == 0;
            const bool is_ahead = PyUnicode_Check(kind) && PyUnicode_CompareWithASCIIString(kind, "runahead") == 0;
            if (!is_live && !is_ahead)
                return "stream " + repr(sid) + ": kind must be 'live' or 'runahead', got " +
                       py::repr(kind).cast<std::string>();
            live = is_live;
        }
        const Fast seq(tokens, "new_tokens must be a sequence");
        int64_t low = 0;
        try {
            tokens_of(seq, 0, buf_, &low);
        } catch (const py::value_error& exc) {
            return "stream " + repr(sid) + ": " + exc.what();
        }
        if (seq.size() && low < 0) return "stream " + repr(sid) + ": token ids must be >= 0, got " + std::to_string(low);
        if (core_.extend(sid, key, task, buf_.data(), static_cast<int64_t>(buf_.size()), live) ==
            srt::ExtendStatus::kMismatch) {
            std::string was_key;
            bool was_live = true;
            core_.stream_info(sid, &was_key, &was_live);
            return "stream " + repr(sid) + " is a " + (was_live ? "live" : "runahead") + " stream from state " +
                   repr(was_key) + ", not a " + (live ? "live" : "runahead") + " one from " + repr(key) +
                   "; use a new stream id per generation";
        }
        return std::string();
    }

    // The DraftTree builder, made once (its interned names and source strings) per class.
    const TreeMaker& maker_for(py::handle cls, py::handle empty) {
        if (!maker_ || !maker_->for_(cls, empty)) maker_ = std::make_unique<TreeMaker>(cls, empty);
        return *maker_;
    }

    srt::TreeCore core_;
    std::unique_ptr<TreeMaker> maker_;
    std::vector<int32_t> buf_;
    srt::Draft draft_;
};

}  // namespace

void bind_tree_core(py::module_& m) {
    py::class_<PyTreeCore>(m, "TreeCore", "The tree cache's core (see srt_agent.tree_cache.native_core).")
        .def(py::init<std::vector<int>, int, int, int, int64_t, std::vector<int64_t>>(), py::arg("windows"),
             py::arg("max_match"), py::arg("scan_limit"), py::arg("max_candidates"), py::arg("byte_budget"),
             py::arg("byte_model"))
        .def("draft_many", &PyTreeCore::draft_many, py::arg("queries"), py::arg("tree_cls"), py::arg("empty"))
        .def("draft", &PyTreeCore::draft, py::arg("state_key"), py::arg("task_id"), py::arg("generated"),
             py::arg("budget"), py::arg("tree_cls"), py::arg("empty"))
        .def("draft_flat", &PyTreeCore::draft_flat, py::arg("queries"), py::arg("roots"), py::arg("width"),
             py::arg("vocab_size"), py::arg("tokens"), py::arg("mask"))
        .def("extend_many", &PyTreeCore::extend_many, py::arg("updates"))
        .def("insert", &PyTreeCore::insert, py::arg("state_key"), py::arg("task_id"), py::arg("tokens"),
             py::arg("live"))
        .def("finish", &PyTreeCore::finish, py::arg("stream_id"))
        .def("enforce_budget", &PyTreeCore::enforce_budget)
        .def("evict_lru", &PyTreeCore::evict_lru)
        .def("state_keys", &PyTreeCore::state_keys)
        .def("has_state", &PyTreeCore::has_state, py::arg("state_key"))
        .def("sizes", &PyTreeCore::sizes)
        .def("counters", &PyTreeCore::counters)
        .def("set_counters", &PyTreeCore::set_counters, py::arg("values"))
        .def_property("next_tick", &PyTreeCore::next_tick, &PyTreeCore::set_next_tick)
        .def("export_trees", &PyTreeCore::export_trees)
        .def("import_tree", &PyTreeCore::import_tree, py::arg("state_key"), py::arg("task_id"), py::arg("parents"),
             py::arg("tokens"), py::arg("counts"), py::arg("ends"), py::arg("live"), py::arg("ticks"))
        .def("index_all", &PyTreeCore::index_all)
        .def("problems", &PyTreeCore::problems);
    m.def(
        "native_byte_model",
        [](int n_windows) {
            const srt::ByteModel b = srt::native_bytes(n_windows);
            return std::vector<int64_t>{b.node, b.small_map, b.map_entry, b.index_key,
                                        b.state, b.stream, b.stream_token, b.task};
        },
        py::arg("n_windows"), "The byte model of the native core's own structures (8 prices).");
}
