// symmem._fastcall: the C ABI's per-call collectives (symmem_all_reduce, ...) called from Python
// without ctypes. A ctypes call converts each argument through a ctypes object (about 0.1-0.2 us
// each, 2-3 us for a collective's ten); this module reads them as plain integers. It binds to the
// library ctypes already loaded (its dlopen handle), so both always call the same copy.
//
// CPython's limited API (3.10, METH_FASTCALL): one build serves every CPython from 3.10 on; no
// torch. Pointers and streams are Python ints, as everywhere in the package. The GIL is released
// around each call, as ctypes.CDLL does.
#define Py_LIMITED_API 0x030A0000
#include <Python.h>
#include <dlfcn.h>

#include <cstddef>

namespace {

using ReductionFn = int (*)(void*, void*, const void*, size_t, int, int, void*, int, int, int);
using AllGatherFn = int (*)(void*, void*, const void*, size_t, int, void*, int, int, int);
using AllToAllFn = int (*)(void*, void*, const void*, size_t, void*, int, int, int);

ReductionFn all_reduce_fn, reduce_scatter_fn;
AllGatherFn all_gather_fn;
AllToAllFn all_to_all_fn;

bool bound() {
  if (all_reduce_fn) return true;
  PyErr_SetString(PyExc_RuntimeError, "symmem._fastcall: bind() was not called");
  return false;
}

bool arity(const char* name, Py_ssize_t given, Py_ssize_t expected) {
  if (given == expected) return true;
  PyErr_Format(PyExc_TypeError, "symmem._fastcall.%s takes %zd arguments (%zd given)", name, expected, given);
  return false;
}

// Reads argument i as a pointer, a size_t or an int; a failure leaves the Python error set, and
// the caller tests PyErr_Occurred() once after reading them all.
void* pointer_at(PyObject* const* args, int i) { return args[i] == Py_None ? nullptr : PyLong_AsVoidPtr(args[i]); }
size_t size_at(PyObject* const* args, int i) { return PyLong_AsSize_t(args[i]); }
int int_at(PyObject* const* args, int i) { return static_cast<int>(PyLong_AsLong(args[i])); }

PyObject* reduction(ReductionFn fn, const char* name, PyObject* const* args, Py_ssize_t n) {
  if (!bound() || !arity(name, n, 10)) return nullptr;
  void* comm = pointer_at(args, 0);
  void* out = pointer_at(args, 1);
  const void* in = pointer_at(args, 2);
  const size_t count = size_at(args, 3);
  const int dtype = int_at(args, 4), op = int_at(args, 5);
  void* stream = pointer_at(args, 6);
  const int algo = int_at(args, 7), blocks = int_at(args, 8), max_blocks = int_at(args, 9);
  if (PyErr_Occurred()) return nullptr;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = fn(comm, out, in, count, dtype, op, stream, algo, blocks, max_blocks);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

PyObject* all_reduce(PyObject*, PyObject* const* args, Py_ssize_t n) {
  return reduction(all_reduce_fn, "all_reduce", args, n);
}

PyObject* reduce_scatter(PyObject*, PyObject* const* args, Py_ssize_t n) {
  return reduction(reduce_scatter_fn, "reduce_scatter", args, n);
}

PyObject* all_gather(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!bound() || !arity("all_gather", n, 9)) return nullptr;
  void* comm = pointer_at(args, 0);
  void* out = pointer_at(args, 1);
  const void* in = pointer_at(args, 2);
  const size_t count = size_at(args, 3);
  const int dtype = int_at(args, 4);
  void* stream = pointer_at(args, 5);
  const int algo = int_at(args, 6), blocks = int_at(args, 7), max_blocks = int_at(args, 8);
  if (PyErr_Occurred()) return nullptr;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = all_gather_fn(comm, out, in, count, dtype, stream, algo, blocks, max_blocks);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

PyObject* all_to_all(PyObject*, PyObject* const* args, Py_ssize_t n) {
  if (!bound() || !arity("all_to_all", n, 8)) return nullptr;
  void* comm = pointer_at(args, 0);
  void* out = pointer_at(args, 1);
  const void* in = pointer_at(args, 2);
  const size_t bytes = size_at(args, 3);
  void* stream = pointer_at(args, 4);
  const int algo = int_at(args, 5), blocks = int_at(args, 6), max_blocks = int_at(args, 7);
  if (PyErr_Occurred()) return nullptr;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = all_to_all_fn(comm, out, in, bytes, stream, algo, blocks, max_blocks);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

// bind(handle): looks the functions up in the library of dlopen handle `handle` (ctypes' CDLL._handle).
PyObject* bind(PyObject*, PyObject* arg) {
  void* handle = PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return nullptr;
  void* ar = dlsym(handle, "symmem_all_reduce");
  void* rs = dlsym(handle, "symmem_reduce_scatter");
  void* ag = dlsym(handle, "symmem_all_gather");
  void* aa = dlsym(handle, "symmem_all_to_all");
  if (!ar || !rs || !ag || !aa) {
    PyErr_SetString(PyExc_ImportError, "symmem._fastcall: the library lacks symmem_all_reduce, "
                                       "symmem_reduce_scatter, symmem_all_gather or symmem_all_to_all");
    return nullptr;
  }
  all_reduce_fn = reinterpret_cast<ReductionFn>(ar);
  reduce_scatter_fn = reinterpret_cast<ReductionFn>(rs);
  all_gather_fn = reinterpret_cast<AllGatherFn>(ag);
  all_to_all_fn = reinterpret_cast<AllToAllFn>(aa);
  Py_RETURN_NONE;
}

// A METH_FASTCALL function in PyMethodDef's slot, as CPython's own modules cast it.
PyCFunction fastcall(PyObject* (*fn)(PyObject*, PyObject* const*, Py_ssize_t)) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fn));
}

PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(handle): binds to the symmem C ABI of dlopen handle `handle`."},
    {"all_reduce", fastcall(all_reduce), METH_FASTCALL,
     "all_reduce(comm, out, in, count, dtype, op, stream, algo, blocks, max_blocks) -> symmem_all_reduce's code"},
    {"reduce_scatter", fastcall(reduce_scatter), METH_FASTCALL,
     "reduce_scatter(comm, out, in, count, dtype, op, stream, algo, blocks, max_blocks) -> the C ABI's code"},
    {"all_gather", fastcall(all_gather), METH_FASTCALL,
     "all_gather(comm, out, in, count, dtype, stream, algo, blocks, max_blocks) -> the C ABI's code"},
    {"all_to_all", fastcall(all_to_all), METH_FASTCALL,
     "all_to_all(comm, out, in, bytes, stream, algo, blocks, max_blocks) -> the C ABI's code"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall", "The C ABI's per-call collectives without ctypes.", -1,
                      methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__fastcall() { return PyModule_Create(&module); }
