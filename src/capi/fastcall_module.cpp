// symmem._fastcall: the C ABI's per-call collectives (symmem_all_reduce, ..., all_to_all_v and
// all_to_all_vdev, the MoE dispatch and combine) called from Python without ctypes. A ctypes call converts each argument
// through a ctypes object (about 0.1-0.2 us each, 2-3 us for a collective's ten); this module reads
// them as integers, with the signatures of include/symmem/symmem_c.h. It binds to the library
// ctypes already loaded (its dlopen handle), so both always call the same copy.
//
// CPython's limited API (3.10, METH_FASTCALL): one build serves every CPython from 3.10 on; no
// torch. Pointers and streams are Python ints, as everywhere in the package. The GIL is released
// around each call, as ctypes.CDLL does.
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "symmem/symmem_c.h"

namespace {

// The C ABI's own declarations (symmem_c.h): a change of a signature changes these, never a copy.
decltype(&symmem_all_reduce) all_reduce_fn;
decltype(&symmem_reduce_scatter) reduce_scatter_fn;
decltype(&symmem_all_gather) all_gather_fn;
decltype(&symmem_all_to_all) all_to_all_fn;
decltype(&symmem_all_to_all_v) all_to_all_v_fn;
decltype(&symmem_all_to_all_vdev) all_to_all_vdev_fn;
decltype(&symmem_ep_dispatch) ep_dispatch_fn;
decltype(&symmem_ep_combine) ep_combine_fn;

// One argument as the C parameter's type, as ctypes takes it: a pointer (c_void_p) from an int or
// None (NULL); a size (c_size_t) or an int (c_int, c_int64) from an int or an object with
// __index__. False, with the Python error set, if not.
template <typename T>
bool from_python(PyObject* arg, T* out) {
  if constexpr (std::is_pointer_v<T>) {
    if (arg == Py_None) {
      *out = nullptr;
      return true;
    }
    if (!PyLong_Check(arg)) {
      PyErr_SetString(PyExc_TypeError, "symmem._fastcall: an address must be an int or None");
      return false;
    }
    *out = static_cast<T>(PyLong_AsVoidPtr(arg));
  } else {
    static_assert(std::is_same_v<T, size_t> || std::is_same_v<T, int> || std::is_same_v<T, int64_t>,
                  "a C ABI parameter of another type");
    PyObject* index = PyNumber_Index(arg);  // (the int itself, one more reference, for an int)
    if (!index) return false;
    if constexpr (std::is_same_v<T, size_t>)
      *out = PyLong_AsSize_t(index);
    else if constexpr (std::is_same_v<T, int64_t>)
      *out = PyLong_AsLongLong(index);
    else
      *out = static_cast<int>(PyLong_AsLong(index));
    Py_DECREF(index);
  }
  return !PyErr_Occurred();
}

template <typename... Params, size_t... I>
PyObject* call_with(int (*fn)(Params...), PyObject* const* args, std::index_sequence<I...>) {
  std::tuple<Params...> values{};
  // In order, stopping at the first argument it cannot take (no conversion runs after an error).
  if (!(from_python(args[I], &std::get<I>(values)) && ...)) return nullptr;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = std::apply(fn, values);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

// fn(*args) with the GIL released: the C ABI's return code, or a Python error for arguments it
// cannot take (their count, a type, a negative size).
template <typename... Params>
PyObject* call(int (*fn)(Params...), const char* name, PyObject* const* args, Py_ssize_t n) {
  if (!fn) {
    PyErr_SetString(PyExc_RuntimeError, "symmem._fastcall: bind() was not called");
    return nullptr;
  }
  if (n != static_cast<Py_ssize_t>(sizeof...(Params))) {
    PyErr_Format(PyExc_TypeError, "symmem._fastcall.%s takes %zd arguments (%zd given)", name,
                 static_cast<Py_ssize_t>(sizeof...(Params)), n);
    return nullptr;
  }
  return call_with(fn, args, std::index_sequence_for<Params...>{});
}

// The Python function of C ABI function `fn` (one of the slots above), `name` in its errors.
template <auto& fn, const char* name>
PyObject* entry(PyObject*, PyObject* const* args, Py_ssize_t n) {
  return call(fn, name, args, n);
}

constexpr char kAllReduce[] = "all_reduce";
constexpr char kReduceScatter[] = "reduce_scatter";
constexpr char kAllGather[] = "all_gather";
constexpr char kAllToAll[] = "all_to_all";
constexpr char kAllToAllV[] = "all_to_all_v";
constexpr char kAllToAllVdev[] = "all_to_all_vdev";
constexpr char kEpDispatch[] = "ep_dispatch";
constexpr char kEpCombine[] = "ep_combine";

// Sets `slot` to the function `name` of dlopen handle `handle`; false, with an ImportError set, if
// the library lacks it (bind() then fails, and the package calls through ctypes).
template <typename F>
bool look_up(void* handle, const char* name, F* slot) {
  void* found = dlsym(handle, name);
  if (!found) PyErr_Format(PyExc_ImportError, "symmem._fastcall: the library lacks %s", name);
  *slot = reinterpret_cast<F>(found);
  return found != nullptr;
}

// bind(handle): looks the functions up in the library of dlopen handle `handle` (ctypes' CDLL._handle).
PyObject* bind(PyObject*, PyObject* arg) {
  void* handle = PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return nullptr;
  if (!look_up(handle, "symmem_all_reduce", &all_reduce_fn) ||
      !look_up(handle, "symmem_reduce_scatter", &reduce_scatter_fn) ||
      !look_up(handle, "symmem_all_gather", &all_gather_fn) || !look_up(handle, "symmem_all_to_all", &all_to_all_fn) ||
      !look_up(handle, "symmem_all_to_all_v", &all_to_all_v_fn) ||
      !look_up(handle, "symmem_all_to_all_vdev", &all_to_all_vdev_fn) ||
      !look_up(handle, "symmem_ep_dispatch", &ep_dispatch_fn) || !look_up(handle, "symmem_ep_combine", &ep_combine_fn))
    return nullptr;
  Py_RETURN_NONE;
}

// A METH_FASTCALL function in PyMethodDef's slot, as CPython's own modules cast it.
PyCFunction fastcall(PyObject* (*fn)(PyObject*, PyObject* const*, Py_ssize_t)) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn));
}

PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(handle): binds to the symmem C ABI of dlopen handle `handle`."},
    {kAllReduce, fastcall(entry<all_reduce_fn, kAllReduce>), METH_FASTCALL,
     "all_reduce(comm, out, in, count, dtype, op, stream, algo, blocks, max_blocks) -> symmem_all_reduce's code"},
    {kReduceScatter, fastcall(entry<reduce_scatter_fn, kReduceScatter>), METH_FASTCALL,
     "reduce_scatter(comm, out, in, count, dtype, op, stream, algo, blocks, max_blocks) -> the C ABI's code"},
    {kAllGather, fastcall(entry<all_gather_fn, kAllGather>), METH_FASTCALL,
     "all_gather(comm, out, in, count, dtype, stream, algo, blocks, max_blocks) -> the C ABI's code"},
    {kAllToAll, fastcall(entry<all_to_all_fn, kAllToAll>), METH_FASTCALL,
     "all_to_all(comm, out, in, bytes, stream, algo, blocks, max_blocks) -> the C ABI's code"},
    {kAllToAllV, fastcall(entry<all_to_all_v_fn, kAllToAllV>), METH_FASTCALL,
     "all_to_all_v(comm, out, out_rows, in, in_rows, in_splits, out_splits, row_bytes, stream, algo, blocks, "
     "max_blocks) -> the C ABI's code (the splits: addresses of world int64 values each)"},
    {kAllToAllVdev, fastcall(entry<all_to_all_vdev_fn, kAllToAllVdev>), METH_FASTCALL,
     "all_to_all_vdev(comm, out, out_rows, in, in_rows, in_splits, out_splits_offsets, row_bytes, experts, "
     "major_align, stream, algo, blocks, max_blocks) -> the C ABI's code"},
    {kEpDispatch, fastcall(entry<ep_dispatch_fn, kEpDispatch>), METH_FASTCALL,
     "ep_dispatch(ep, x, x_scales, topk_idx, topk_idx_int64, topk_weights, num_tokens, num_tokens_device, "
     "stream) -> symmem_ep_dispatch's code"},
    {kEpCombine, fastcall(entry<ep_combine_fn, kEpCombine>), METH_FASTCALL,
     "ep_combine(ep, expert_out, out, weights_applied, topk_weights, stream) -> symmem_ep_combine's code"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall", "The C ABI's per-call collectives without ctypes.", -1,
                      methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__fastcall() { return PyModule_Create(&module); }
