/* polytile: the C fast path of a CUDA kernel call (see fastcall.py).

   One `Call` object per signature that the Python path has already worked out and run. A call on
   arrays of that signature does here, without Python frames: check each array against the values
   recorded from the first call's arrays (the same attributes the Python signature key reads), get
   the data pointers, allocate the outputs through the framework's allocators, take the caller's
   current stream, clear outputs that start as zeros, write the pointers into the launch's packed
   arguments and call cuLaunchKernel. Anything it does not take for granted (another type or
   signature, another current context, overlapping or misaligned arrays) makes it return None, and
   the caller takes the Python path, which raises its own errors. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <cuda.h>

#ifdef Py_GIL_DISABLED
#error "the packed arguments of a Call are shared by its callers: a free-threaded build takes the Python path"
#endif

typedef __typeof__(&cuLaunchKernel) launch_fn;
typedef __typeof__(&cuMemsetD8Async) memset_fn;
typedef __typeof__(&cuCtxGetCurrent) context_fn;

#define MAX_ARRAYS 64
#define ALIGNMENT 16

typedef struct {
  CUfunction function;
  unsigned grid[3], block[3], shared;
  uint64_t *buffer; /* the argument values, 8 bytes each; the per-call pointers first */
  void **args;      /* what the driver reads: the address of each argument */
  Py_ssize_t n_pointers;
  Py_ssize_t *pointer_of; /* per-call pointer slot -> the call's array */
} Launch;

typedef struct {
  PyObject_HEAD
  PyTypeObject *type;     /* every array's exact type */
  Py_ssize_t n_arrays;    /* arrays a call passes */
  Py_ssize_t n_total;     /* inputs and outputs */
  Py_ssize_t n_inputs;
  Py_ssize_t n_probes;
  PyObject **probe_names; /* attributes, or methods called without arguments, that make the signature */
  int *probe_calls;
  PyObject **expected;    /* n_arrays * n_probes values recorded from the first call's arrays */
  PyObject *pointer_name;
  int pointer_call;
  PyObject *allocators;   /* (input index or None, make) per array the call allocates: the outputs when
                             not given, then the temporaries (indices n_total onwards) */
  PyObject *current_stream; /* the framework's current stream: a function of the device ordinal */
  PyObject *ordinal;
  Py_ssize_t n_zero;
  Py_ssize_t *zero_index;
  size_t *zero_bytes;
  size_t *nbytes;         /* per array, for the overlap check */
  Py_ssize_t n_disjoint;
  Py_ssize_t *disjoint;   /* pairs (output, other) that must not overlap */
  CUcontext context;
  Py_ssize_t n_launches;
  Launch *launches;
  PyObject *on_error;     /* on_error(launch index, status) raises the Python path's error */
  PyObject *keep;         /* what the launches' functions belong to */
  launch_fn launch;
  memset_fn memset;
  context_fn current_context;
  unsigned long long calls; /* calls it ran (tests and benchmarks read it) */
} Call;

static PyTypeObject CallType;

static PyObject *probe(PyObject *a, PyObject *name, int call) {
  return call ? PyObject_CallMethodNoArgs(a, name) : PyObject_GetAttr(a, name);
}

/* The array's pointer, or 0 with an error set. */
static uint64_t pointer_of(Call *c, PyObject *a) {
  PyObject *p = probe(a, c->pointer_name, c->pointer_call);
  if (p == NULL) return 0;
  uint64_t v = (uint64_t)PyLong_AsUnsignedLongLong(p);
  Py_DECREF(p);
  return v;
}

/* 1: the array has the recorded signature; 0: it does not (or reading it failed: no error is left). */
static int matches(Call *c, PyObject *a, Py_ssize_t k) {
  if (Py_TYPE(a) != c->type) return 0;
  for (Py_ssize_t p = 0; p < c->n_probes; ++p) {
    PyObject *v = probe(a, c->probe_names[p], c->probe_calls[p]);
    if (v == NULL) {
      PyErr_Clear();
      return 0;
    }
    PyObject *want = c->expected[k * c->n_probes + p];
    int same = v == want ? 1 : PyObject_RichCompareBool(v, want, Py_EQ);
    Py_DECREF(v);
    if (same != 1) {
      if (same < 0) PyErr_Clear();
      return 0;
    }
  }
  return 1;
}

/* Raise the Python path's error for a failed launch (l: its index) or memset (l = -1). */
static void failed(Call *c, Py_ssize_t l, CUresult status) {
  Py_XDECREF(PyObject_CallFunction(c->on_error, "ni", l, (int)status));
  if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "CUDA error %d in polytile's C call path", (int)status);
}

/* The call's outputs (one array or a tuple), NULL with an error, or None: take the Python path. */
static PyObject *run(Call *c, PyObject *const *arrays, Py_ssize_t n) {
  if (n != c->n_arrays) Py_RETURN_NONE;
  for (Py_ssize_t k = 0; k < n; ++k)
    if (!matches(c, arrays[k], k)) Py_RETURN_NONE;
  CUcontext current = NULL;
  if (c->current_context(&current) != CUDA_SUCCESS || current != c->context) Py_RETURN_NONE;
  uint64_t pointers[MAX_ARRAYS];
  for (Py_ssize_t k = 0; k < n; ++k) {
    pointers[k] = pointer_of(c, arrays[k]);
    if (PyErr_Occurred()) return NULL;
  }
  PyObject *outputs[MAX_ARRAYS];
  Py_ssize_t made = PyTuple_GET_SIZE(c->allocators);
  for (Py_ssize_t j = 0; j < made; ++j) {
    PyObject *spec = PyTuple_GET_ITEM(c->allocators, j);
    PyObject *index = PyTuple_GET_ITEM(spec, 0), *make = PyTuple_GET_ITEM(spec, 1);
    PyObject *out = index == Py_None ? PyObject_CallNoArgs(make)
                                     : PyObject_CallOneArg(make, arrays[PyLong_AsSsize_t(index)]);
    if (out != NULL) {
      pointers[n + j] = pointer_of(c, out);
      if (PyErr_Occurred()) Py_CLEAR(out);
    }
    if (out == NULL) {
      for (Py_ssize_t i = 0; i < j; ++i) Py_DECREF(outputs[i]);
      return NULL;
    }
    outputs[j] = out;
  }
  PyObject *result = NULL;
  for (Py_ssize_t d = 0; d < c->n_disjoint; ++d) {
    Py_ssize_t o = c->disjoint[2 * d], q = c->disjoint[2 * d + 1];
    if (pointers[o] < pointers[q] + c->nbytes[q] && pointers[q] < pointers[o] + c->nbytes[o]) {
      result = Py_None; /* the Python path refuses the overlap */
      goto done;
    }
  }
  uint64_t any = 0;
  for (Py_ssize_t k = 0; k < n + made; ++k) any |= pointers[k];
  if (any % ALIGNMENT) {
    result = Py_None; /* the Python path names the misaligned array */
    goto done;
  }
  PyObject *handle = PyObject_CallOneArg(c->current_stream, c->ordinal);
  if (handle == NULL) goto done;
  CUstream stream = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(handle);
  Py_DECREF(handle);
  if (PyErr_Occurred()) goto done;
  for (Py_ssize_t z = 0; z < c->n_zero; ++z) {
    CUresult status = c->memset((CUdeviceptr)pointers[c->zero_index[z]], 0, c->zero_bytes[z], stream);
    if (status != CUDA_SUCCESS) {
      failed(c, -1, status);
      goto done;
    }
  }
  /* no Python runs from here to the last launch: the packed arguments are this call's alone */
  for (Py_ssize_t l = 0; l < c->n_launches; ++l) {
    Launch *x = &c->launches[l];
    for (Py_ssize_t s = 0; s < x->n_pointers; ++s) x->buffer[s] = pointers[x->pointer_of[s]];
    CUresult status = c->launch(x->function, x->grid[0], x->grid[1], x->grid[2], x->block[0], x->block[1],
                                x->block[2], x->shared, stream, x->args, NULL);
    if (status != CUDA_SUCCESS) {
      failed(c, l, status);
      goto done;
    }
  }
  c->calls++;
  /* the outputs: given ones, or the first ones made */
  PyObject *const *returned = n == c->n_total ? arrays + c->n_inputs : outputs;
  Py_ssize_t n_out = c->n_total - c->n_inputs;
  if (n_out == 1) {
    result = Py_NewRef(returned[0]);
  } else {
    result = PyTuple_New(n_out);
    if (result != NULL)
      for (Py_ssize_t j = 0; j < n_out; ++j) PyTuple_SET_ITEM(result, j, Py_NewRef(returned[j]));
  }
done:
  for (Py_ssize_t j = 0; j < made; ++j) Py_DECREF(outputs[j]);
  if (result == Py_None) Py_INCREF(Py_None);
  return result;
}

/* ---- construction --------------------------------------------------------------------------- */

static Py_ssize_t *indices(PyObject *seq, Py_ssize_t *n, const char *what) {
  PyObject *fast = PySequence_Fast(seq, what);
  if (fast == NULL) return NULL;
  *n = PySequence_Fast_GET_SIZE(fast);
  Py_ssize_t *out = PyMem_Calloc(*n + 1, sizeof(Py_ssize_t));
  for (Py_ssize_t k = 0; out != NULL && k < *n; ++k) {
    out[k] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, k));
    if (out[k] == -1 && PyErr_Occurred()) {
      PyMem_Free(out);
      out = NULL;
    }
  }
  Py_DECREF(fast);
  if (out == NULL && !PyErr_Occurred()) PyErr_NoMemory();
  return out;
}

static int unsigned3(PyObject *t, unsigned out[3]) {
  return PyArg_ParseTuple(t, "III", &out[0], &out[1], &out[2]) ? 0 : -1;
}

/* launch: (function, grid, block, shared bytes, the values' bytes, each argument's byte offset in
   them, the call's array of each per-call pointer, which fill the first 8-byte words) */
static int make_launch(Launch *x, PyObject *spec) {
  unsigned long long function;
  PyObject *grid, *block, *offsets, *pointer_of;
  Py_buffer values;
  if (!PyArg_ParseTuple(spec, "KOOIy*OO", &function, &grid, &block, &x->shared, &values, &offsets, &pointer_of))
    return -1;
  int status = -1;
  Py_ssize_t n_args = 0;
  Py_ssize_t *offset = NULL;
  x->function = (CUfunction)(uintptr_t)function;
  if (unsigned3(grid, x->grid) || unsigned3(block, x->block)) goto out;
  if ((offset = indices(offsets, &n_args, "argument offsets")) == NULL) goto out;
  if ((x->pointer_of = indices(pointer_of, &x->n_pointers, "pointer arguments")) == NULL) goto out;
  x->buffer = PyMem_Calloc(values.len / 8 + 1, 8);
  x->args = PyMem_Calloc(n_args + 1, sizeof(void *));
  if (x->buffer == NULL || x->args == NULL) {
    PyErr_NoMemory();
    goto out;
  }
  memcpy(x->buffer, values.buf, values.len);
  for (Py_ssize_t k = 0; k < n_args; ++k) {
    if (offset[k] < 0 || offset[k] + 8 > values.len) {
      PyErr_SetString(PyExc_ValueError, "an argument offset lies outside the values");
      goto out;
    }
    x->args[k] = (char *)x->buffer + offset[k];
  }
  if (x->n_pointers * 8 > values.len) {
    PyErr_SetString(PyExc_ValueError, "more per-call pointers than values");
    goto out;
  }
  status = 0;
out:
  PyMem_Free(offset);
  PyBuffer_Release(&values);
  return status;
}

static void Call_dealloc(Call *c) {
  for (Py_ssize_t k = 0; c->expected != NULL && k < c->n_arrays * c->n_probes; ++k) Py_XDECREF(c->expected[k]);
  for (Py_ssize_t p = 0; c->probe_names != NULL && p < c->n_probes; ++p) Py_XDECREF(c->probe_names[p]);
  for (Py_ssize_t l = 0; c->launches != NULL && l < c->n_launches; ++l) {
    PyMem_Free(c->launches[l].buffer);
    PyMem_Free(c->launches[l].args);
    PyMem_Free(c->launches[l].pointer_of);
  }
  PyMem_Free(c->expected);
  PyMem_Free(c->probe_names);
  PyMem_Free(c->probe_calls);
  PyMem_Free(c->launches);
  PyMem_Free(c->zero_index);
  PyMem_Free(c->zero_bytes);
  PyMem_Free(c->nbytes);
  PyMem_Free(c->disjoint);
  Py_XDECREF(c->type);
  Py_XDECREF(c->pointer_name);
  Py_XDECREF(c->allocators);
  Py_XDECREF(c->current_stream);
  Py_XDECREF(c->ordinal);
  Py_XDECREF(c->on_error);
  Py_XDECREF(c->keep);
  Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyObject *Call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  static char *names[] = {"arrays", "n_inputs", "probes", "pointer", "allocators", "current_stream", "ordinal",
                          "zero", "nbytes", "disjoint", "context", "launches", "on_error", "keep",
                          "driver", NULL};
  PyObject *arrays, *probes, *pointer, *allocators, *current_stream, *ordinal, *zero, *nbytes, *disjoint;
  PyObject *launches, *on_error, *keep;
  Py_ssize_t n_inputs;
  unsigned long long context, launch, memset, current_context;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!nO!O!O!OO!O!OOKO!OO(KKK)", names, &PyTuple_Type, &arrays,
                                   &n_inputs, &PyTuple_Type, &probes, &PyTuple_Type, &pointer, &PyTuple_Type,
                                   &allocators, &current_stream, &PyLong_Type, &ordinal, &PyTuple_Type, &zero, &nbytes,
                                   &disjoint, &context, &PyTuple_Type, &launches, &on_error, &keep, &launch,
                                   &memset, &current_context))
    return NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(arrays);
  if (n == 0 || n > MAX_ARRAYS) {
    PyErr_Format(PyExc_ValueError, "a Call takes 1 to %d arrays", MAX_ARRAYS);
    return NULL;
  }
  Call *c = (Call *)type->tp_alloc(type, 0);
  if (c == NULL) return NULL;
  c->n_arrays = n;
  c->n_inputs = n_inputs;
  c->type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(PyTuple_GET_ITEM(arrays, 0)));
  c->n_probes = PyTuple_GET_SIZE(probes);
  c->probe_names = PyMem_Calloc(c->n_probes + 1, sizeof(PyObject *));
  c->probe_calls = PyMem_Calloc(c->n_probes + 1, sizeof(int));
  c->expected = PyMem_Calloc(n * c->n_probes + 1, sizeof(PyObject *));
  c->launch = (launch_fn)(uintptr_t)launch;
  c->memset = (memset_fn)(uintptr_t)memset;
  c->current_context = (context_fn)(uintptr_t)current_context;
  c->context = (CUcontext)(uintptr_t)context;
  c->allocators = Py_NewRef(allocators);
  c->current_stream = Py_NewRef(current_stream);
  c->ordinal = Py_NewRef(ordinal);
  c->on_error = Py_NewRef(on_error);
  c->keep = Py_NewRef(keep);
  if (c->probe_names == NULL || c->probe_calls == NULL || c->expected == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  if (!launch || !memset || !current_context || !PyCallable_Check(current_stream) || !PyCallable_Check(on_error)) {
    PyErr_SetString(PyExc_ValueError, "a Call needs the driver's entry points, a current stream and on_error");
    goto fail;
  }
  for (Py_ssize_t p = 0; p < c->n_probes; ++p) {
    PyObject *name;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(probes, p), "Up", &name, &c->probe_calls[p])) goto fail;
    c->probe_names[p] = Py_NewRef(name);
  }
  if (!PyArg_ParseTuple(pointer, "Up", &c->pointer_name, &c->pointer_call)) goto fail;
  Py_INCREF(c->pointer_name);
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject *a = PyTuple_GET_ITEM(arrays, k);
    if (Py_TYPE(a) != c->type) {
      PyErr_SetString(PyExc_TypeError, "a Call's arrays are of one type");
      goto fail;
    }
    for (Py_ssize_t p = 0; p < c->n_probes; ++p)
      if ((c->expected[k * c->n_probes + p] = probe(a, c->probe_names[p], c->probe_calls[p])) == NULL) goto fail;
  }
  Py_ssize_t n_bytes = 0, n_pairs = 0, n_zero = 0;
  Py_ssize_t *zeros = NULL;
  if ((c->zero_index = indices(zero, &n_zero, "zero outputs")) == NULL) goto fail;
  zeros = c->zero_index; /* (index, bytes) pairs, split below */
  c->n_zero = n_zero / 2;
  c->zero_bytes = PyMem_Calloc(c->n_zero + 1, sizeof(size_t));
  if (c->zero_bytes == NULL) goto fail;
  for (Py_ssize_t z = 0; z < c->n_zero; ++z) {
    c->zero_bytes[z] = (size_t)zeros[2 * z + 1];
    zeros[z] = zeros[2 * z];
  }
  Py_ssize_t *sizes = indices(nbytes, &n_bytes, "array sizes");
  if (sizes == NULL) goto fail;
  c->nbytes = (size_t *)sizes;
  c->n_total = n_bytes;
  Py_ssize_t all = n + PyTuple_GET_SIZE(allocators); /* arrays, made ones included */
  if (all > MAX_ARRAYS || c->n_total < n || all < c->n_total || c->n_inputs < 0 || c->n_inputs >= c->n_total ||
      (n != c->n_inputs && n != c->n_total)) {
    PyErr_SetString(PyExc_ValueError, "a Call's sizes, arrays and allocators disagree");
    goto fail;
  }
  for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(allocators); ++j) {
    PyObject *spec = PyTuple_GET_ITEM(allocators, j), *index;
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2 || !PyCallable_Check(PyTuple_GET_ITEM(spec, 1)) ||
        ((index = PyTuple_GET_ITEM(spec, 0)) != Py_None &&
         (!PyLong_Check(index) || PyLong_AsSsize_t(index) < 0 || PyLong_AsSsize_t(index) >= n))) {
      PyErr_Clear();
      PyErr_SetString(PyExc_ValueError, "an allocator is (an array's index or None, a function)");
      goto fail;
    }
  }
  if ((c->disjoint = indices(disjoint, &n_pairs, "disjoint pairs")) == NULL) goto fail;
  c->n_disjoint = n_pairs / 2;
  c->n_launches = PyTuple_GET_SIZE(launches);
  c->launches = PyMem_Calloc(c->n_launches + 1, sizeof(Launch));
  if (c->launches == NULL) goto fail;
  for (Py_ssize_t l = 0; l < c->n_launches; ++l) {
    if (make_launch(&c->launches[l], PyTuple_GET_ITEM(launches, l))) goto fail;
    for (Py_ssize_t s = 0; s < c->launches[l].n_pointers; ++s)
      if (c->launches[l].pointer_of[s] < 0 || c->launches[l].pointer_of[s] >= all) {
        PyErr_SetString(PyExc_ValueError, "a per-call pointer names no array of the call");
        goto fail;
      }
  }
  for (Py_ssize_t z = 0; z < c->n_zero; ++z)
    if (c->zero_index[z] < 0 || c->zero_index[z] >= c->n_total) {
      PyErr_SetString(PyExc_ValueError, "a zero output names no array of the call");
      goto fail;
    }
  for (Py_ssize_t d = 0; d < 2 * c->n_disjoint; ++d)
    if (c->disjoint[d] < 0 || c->disjoint[d] >= c->n_total) {
      PyErr_SetString(PyExc_ValueError, "a disjoint pair names no array of the call");
      goto fail;
    }
  return (PyObject *)c;
fail:
  Py_DECREF(c);
  return NULL;
}

static PyObject *Call_call(Call *c, PyObject *args, PyObject *kwargs) {
  if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) Py_RETURN_NONE;
  return run(c, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args));
}

static PyObject *Call_get_calls(Call *c, void *closure) {
  (void)closure;
  return PyLong_FromUnsignedLongLong(c->calls);
}

static PyGetSetDef Call_getset[] = {
    {"calls", (getter)Call_get_calls, NULL, "calls this object ran", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "polytile.runtime._fastcall.Call",
    .tp_basicsize = sizeof(Call),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One signature's call in C: Call(...)(*arrays) returns the outputs, or None for the Python path.",
    .tp_new = Call_new,
    .tp_dealloc = (destructor)Call_dealloc,
    .tp_call = (ternaryfunc)Call_call,
    .tp_getset = Call_getset,
};

/* first(calls, arrays): the outputs of the first Call in the list that takes the arrays, or None. */
static PyObject *first(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
  (void)module;
  if (nargs != 2 || !PyList_Check(args[0]) || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "first(calls: list, arrays: tuple)");
    return NULL;
  }
  PyObject *calls = args[0], *arrays = args[1];
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(calls); ++k) {
    PyObject *c = PyList_GET_ITEM(calls, k);
    if (Py_TYPE(c) != &CallType) continue;
    PyObject *out = run((Call *)c, &PyTuple_GET_ITEM(arrays, 0), PyTuple_GET_SIZE(arrays));
    if (out != Py_None) return out;
    Py_DECREF(out);
  }
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"first", (PyCFunction)(void (*)(void))first, METH_FASTCALL, "first(calls, arrays): see the C source"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, .m_name = "_fastcall", .m_size = -1, .m_methods = methods};

PyMODINIT_FUNC PyInit__fastcall(void) {
  if (PyType_Ready(&CallType) < 0) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  if (PyModule_AddObjectRef(m, "Call", (PyObject *)&CallType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
