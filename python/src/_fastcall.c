/* mlajit._fastcall: the eager launch path of mlajit.ops in C.
 *
 * Each function takes an op handle, the device and stream of the launch and the op's tensors as
 * Python objects, fills the C API's mlajit_tensor / mlajit_paged_cache structs on the C stack and
 * calls the C API through the function pointers that mlajit._launch binds (the libmlajit.so that
 * ctypes loaded, so there is one library in the process whatever MLAJIT_LIBRARY says). The same
 * functions through ctypes (_launch_ctypes.py) cost several microseconds more per call: building
 * argument structs in Python and converting every ctypes argument is most of the Python-side host
 * time of a launch.
 *
 * torch.Tensor objects are read through their Python attributes (dtype, shape, stride(),
 * data_ptr()): no torch headers, so one build serves every torch version. Anything else (another
 * tensor type, an unsupported dtype, too many dims, a broadcast view) goes through the Python
 * fallback `fields(obj)` of mlajit._tensor, which also raises the errors with their messages.
 * Errors of the library are raised by the Python `raise_for(status)` (the C++ message).
 *
 * Built against the stable ABI (Py_LIMITED_API 3.8): one binary serves every CPython >= 3.8.
 */
#define Py_LIMITED_API 0x03080000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "mlajit/c_api.h"

#define NUM_DTYPES 7

/* The C API entry points, bound once by bind(). */
typedef mlajit_status (*set_device_fn)(int);
typedef mlajit_status (*store_fn)(mlajit_op, const mlajit_tensor*, const mlajit_tensor*, const mlajit_paged_cache*,
                                  int, int, const mlajit_tensor*, void*);
typedef mlajit_status (*gather_fn)(mlajit_op, const mlajit_paged_cache*, const mlajit_tensor*, const mlajit_tensor*,
                                   int, int, const mlajit_tensor*, const mlajit_tensor*, void*);
typedef mlajit_status (*remap_fn)(mlajit_op, const mlajit_tensor*, const mlajit_tensor*, const mlajit_tensor*,
                                  int64_t, const mlajit_tensor*, void*);
typedef mlajit_status (*indexer_fn)(mlajit_op, const mlajit_tensor*, const mlajit_tensor*, const mlajit_tensor*,
                                    const mlajit_paged_cache*, int, int64_t, const mlajit_tensor*,
                                    const mlajit_tensor*, void*);
typedef mlajit_status (*prefill_fn)(mlajit_op, const mlajit_tensor*, const mlajit_paged_cache*, const mlajit_tensor*,
                                    const mlajit_tensor*, int, float, const mlajit_tensor*, const mlajit_tensor*,
                                    const mlajit_tensor*, const mlajit_tensor*, void*);

static struct {
  set_device_fn set_device;
  store_fn kv_cache_store;
  gather_fn kv_cache_gather;
  remap_fn sparse_index_remap;
  indexer_fn mla_indexer;
  prefill_fn sparse_prefill;
  PyObject* tensor_type;        /* torch.Tensor (exact type: the attribute fast path), or None */
  PyObject* dtypes[NUM_DTYPES]; /* torch dtype object of each mlajit_dtype code, or None */
  PyObject* fields;             /* mlajit._tensor.fields(obj) -> (data, code, ndim, shape[6], strides[6]) */
  PyObject* raw_stream;         /* device -> torch's current CUstream of that device (int), or None */
  PyObject* raise_for;          /* status -> raises the exception of that status with the C++ message */
} api;

static PyObject *name_dtype, *name_shape, *name_stride, *name_data_ptr;

/* The device whose primary context mlajit_set_device made current: the C API keeps it per thread. */
static _Thread_local int current_device = -1;

/* ---- tensors ---------------------------------------------------------------------------------- */

/* The int64 items of a tuple (torch.Size, stride()) into dims[MLAJIT_MAX_DIMS], zero padded.
 * Returns the count, or -1 with nothing raised when the tuple does not fit (the fallback reports). */
static int read_dims(PyObject* tuple, int64_t* dims) {
  Py_ssize_t n = PyTuple_Size(tuple);
  if (n < 0 || n > MLAJIT_MAX_DIMS) {
    PyErr_Clear();
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    dims[i] = PyLong_AsLongLong(PyTuple_GetItem(tuple, i));
    if (dims[i] == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return -1;
    }
  }
  memset(dims + n, 0, (MLAJIT_MAX_DIMS - n) * sizeof(int64_t));
  return (int)n;
}

/* A torch.Tensor through its attributes. Returns 0 when filled, 1 when the fallback must handle
 * it (unsupported dtype, > 6 dims, broadcast view: it raises the right error), -1 on a Python error. */
static int fill_from_torch(PyObject* t, mlajit_tensor* out) {
  PyObject* dtype = PyObject_GetAttr(t, name_dtype);
  if (dtype == NULL) return -1;
  int code = -1;
  for (int i = 0; i < NUM_DTYPES; ++i) {
    if (api.dtypes[i] == dtype) code = i;
  }
  Py_DECREF(dtype);
  if (code < 0) return 1;

  PyObject* shape = PyObject_GetAttr(t, name_shape);
  if (shape == NULL) return -1;
  int ndim = read_dims(shape, out->shape);
  Py_DECREF(shape);
  if (ndim < 0) return 1;

  PyObject* strides = PyObject_CallMethodObjArgs(t, name_stride, NULL);
  if (strides == NULL) return -1;
  int nstrides = read_dims(strides, out->strides);
  Py_DECREF(strides);
  if (nstrides != ndim) return 1;
  /* All-zero strides mean "contiguous" in the C API: a broadcast view of more than one element
   * would be misread, so the fallback refuses it with its message. */
  int64_t numel = 1, any_stride = 0;
  for (int i = 0; i < ndim; ++i) {
    numel *= out->shape[i];
    any_stride |= out->strides[i];
  }
  if (ndim > 0 && any_stride == 0 && numel > 1) return 1;

  PyObject* data = PyObject_CallMethodObjArgs(t, name_data_ptr, NULL);
  if (data == NULL) return -1;
  out->data = PyLong_AsVoidPtr(data);
  Py_DECREF(data);
  if (out->data == NULL && PyErr_Occurred()) return -1;
  out->dtype = code;
  out->ndim = ndim;
  return 0;
}

/* Anything through mlajit._tensor.fields (which raises for what is not a usable tensor). */
static int fill_from_fields(PyObject* obj, mlajit_tensor* out) {
  PyObject* f = PyObject_CallFunctionObjArgs(api.fields, obj, NULL);
  if (f == NULL) return -1;
  PyObject *data, *shape, *strides;
  int code, ndim;
  int ok = PyArg_ParseTuple(f, "OiiOO", &data, &code, &ndim, &shape, &strides);
  if (ok) {
    out->data = PyLong_AsVoidPtr(data);
    out->dtype = code;
    out->ndim = ndim;
    if ((out->data == NULL && PyErr_Occurred()) || read_dims(shape, out->shape) < 0 ||
        read_dims(strides, out->strides) < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "mlajit._tensor.fields: malformed shape or strides");
      ok = 0;
    }
  }
  Py_DECREF(f);
  return ok ? 0 : -1;
}

/* obj (None: an absent optional tensor, *ptr = NULL) into *out. Returns 0, or -1 with an error. */
static int tensor_arg(PyObject* obj, mlajit_tensor* out, const mlajit_tensor** ptr) {
  if (obj == Py_None) {
    *ptr = NULL;
    return 0;
  }
  int r = 1;
  if ((PyObject*)Py_TYPE(obj) == api.tensor_type) r = fill_from_torch(obj, out);
  if (r > 0) r = fill_from_fields(obj, out);
  if (r < 0) return -1;
  *ptr = out;
  return 0;
}

typedef struct {
  mlajit_tensor tensors[4];
  mlajit_paged_cache cache;
} cache_arg;

static int cache_args(PyObject* blocks, PyObject* scales, PyObject* lookup_table, PyObject* cache_lengths,
                      cache_arg* c) {
  if (tensor_arg(blocks, &c->tensors[0], &c->cache.blocks) || tensor_arg(scales, &c->tensors[1], &c->cache.scales) ||
      tensor_arg(lookup_table, &c->tensors[2], &c->cache.lookup_table) ||
      tensor_arg(cache_lengths, &c->tensors[3], &c->cache.cache_lengths))
    return -1;
  return 0;
}

/* ---- launch context ---------------------------------------------------------------------------- */

static int check_status(mlajit_status status) {
  if (status == MLAJIT_OK) return 0;
  PyObject* r = PyObject_CallFunction(api.raise_for, "i", (int)status);
  Py_XDECREF(r);
  if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "mlajit call failed with status %d", (int)status);
  return -1;
}

/* The handle (int) as an mlajit_op; device >= 0 made current for this thread; the stream: the
 * given int, else torch's current stream of `device`, else NULL (the legacy default stream). */
static int launch_context(PyObject* handle_obj, int device, PyObject* stream_obj, mlajit_op* op, void** stream) {
  if (api.set_device == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "mlajit._fastcall: bind() was not called");
    return -1;
  }
  *op = (mlajit_op)PyLong_AsVoidPtr(handle_obj);
  if (*op == NULL && PyErr_Occurred()) return -1;
  if (device >= 0 && device != current_device) {
    if (check_status(api.set_device(device))) return -1;
    current_device = device;
  }
  PyObject* owned = NULL;
  if (stream_obj == Py_None && device >= 0 && api.raw_stream != Py_None) {
    owned = PyObject_CallFunction(api.raw_stream, "i", device);
    if (owned == NULL) return -1;
    stream_obj = owned;
  }
  *stream = stream_obj == Py_None ? NULL : PyLong_AsVoidPtr(stream_obj);
  Py_XDECREF(owned);
  return (*stream == NULL && PyErr_Occurred()) ? -1 : 0;
}

#define CALL_RELEASING_GIL(status, call) \
  do {                                   \
    Py_BEGIN_ALLOW_THREADS status = call; \
    Py_END_ALLOW_THREADS                  \
  } while (0)

/* ---- the ops (argument order: the C API's, after handle, device, stream) ---------------------- */

static PyObject* kv_cache_store(PyObject* self, PyObject* args) {
  PyObject *handle, *stream_obj, *x, *offsets, *blocks, *scales, *lut, *lengths, *dropped;
  int device, layer_idx, kv_idx;
  if (!PyArg_ParseTuple(args, "OiOOOOOOOiiO", &handle, &device, &stream_obj, &x, &offsets, &blocks, &scales, &lut,
                        &lengths, &layer_idx, &kv_idx, &dropped))
    return NULL;
  mlajit_tensor t[3];
  const mlajit_tensor *px, *poffsets, *pdropped;
  cache_arg cache;
  mlajit_op op;
  void* stream;
  if (tensor_arg(x, &t[0], &px) || tensor_arg(offsets, &t[1], &poffsets) ||
      cache_args(blocks, scales, lut, lengths, &cache) || tensor_arg(dropped, &t[2], &pdropped) ||
      launch_context(handle, device, stream_obj, &op, &stream))
    return NULL;
  mlajit_status status;
  CALL_RELEASING_GIL(status, api.kv_cache_store(op, px, poffsets, &cache.cache, layer_idx, kv_idx, pdropped, stream));
  if (check_status(status)) return NULL;
  Py_RETURN_NONE;
}

static PyObject* kv_cache_gather(PyObject* self, PyObject* args) {
  PyObject *handle, *stream_obj, *blocks, *scales, *lut, *lengths, *batch_ids, *positions, *y, *dropped;
  int device, layer_idx, kv_idx;
  if (!PyArg_ParseTuple(args, "OiOOOOOOOiiOO", &handle, &device, &stream_obj, &blocks, &scales, &lut, &lengths,
                        &batch_ids, &positions, &layer_idx, &kv_idx, &y, &dropped))
    return NULL;
  mlajit_tensor t[4];
  const mlajit_tensor *pbatch, *ppos, *py, *pdropped;
  cache_arg cache;
  mlajit_op op;
  void* stream;
  if (cache_args(blocks, scales, lut, lengths, &cache) || tensor_arg(batch_ids, &t[0], &pbatch) ||
      tensor_arg(positions, &t[1], &ppos) || tensor_arg(y, &t[2], &py) || tensor_arg(dropped, &t[3], &pdropped) ||
      launch_context(handle, device, stream_obj, &op, &stream))
    return NULL;
  mlajit_status status;
  CALL_RELEASING_GIL(status,
                     api.kv_cache_gather(op, &cache.cache, pbatch, ppos, layer_idx, kv_idx, py, pdropped, stream));
  if (check_status(status)) return NULL;
  Py_RETURN_NONE;
}

static PyObject* sparse_index_remap(PyObject* self, PyObject* args) {
  PyObject *handle, *stream_obj, *indices, *offsets, *lut, *out;
  int device;
  long long num_blocks;
  if (!PyArg_ParseTuple(args, "OiOOOOLO", &handle, &device, &stream_obj, &indices, &offsets, &lut, &num_blocks, &out))
    return NULL;
  mlajit_tensor t[4];
  const mlajit_tensor *pindices, *poffsets, *plut, *pout;
  mlajit_op op;
  void* stream;
  if (tensor_arg(indices, &t[0], &pindices) || tensor_arg(offsets, &t[1], &poffsets) ||
      tensor_arg(lut, &t[2], &plut) || tensor_arg(out, &t[3], &pout) ||
      launch_context(handle, device, stream_obj, &op, &stream))
    return NULL;
  mlajit_status status;
  CALL_RELEASING_GIL(status, api.sparse_index_remap(op, pindices, poffsets, plut, num_blocks, pout, stream));
  if (check_status(status)) return NULL;
  Py_RETURN_NONE;
}

static PyObject* mla_indexer(PyObject* self, PyObject* args) {
  PyObject *handle, *stream_obj, *q, *qs, *offsets, *blocks, *scales, *lut, *lengths, *out, *workspace;
  int device, layer_idx;
  long long max_keys_per_seq;
  if (!PyArg_ParseTuple(args, "OiOOOOOOOOiLOO", &handle, &device, &stream_obj, &q, &qs, &offsets, &blocks, &scales,
                        &lut, &lengths, &layer_idx, &max_keys_per_seq, &out, &workspace))
    return NULL;
  mlajit_tensor t[5];
  const mlajit_tensor *pq, *pqs, *poffsets, *pout, *pworkspace;
  cache_arg cache;
  mlajit_op op;
  void* stream;
  if (tensor_arg(q, &t[0], &pq) || tensor_arg(qs, &t[1], &pqs) || tensor_arg(offsets, &t[2], &poffsets) ||
      cache_args(blocks, scales, lut, lengths, &cache) || tensor_arg(out, &t[3], &pout) ||
      tensor_arg(workspace, &t[4], &pworkspace) || launch_context(handle, device, stream_obj, &op, &stream))
    return NULL;
  mlajit_status status;
  CALL_RELEASING_GIL(status, api.mla_indexer(op, pq, pqs, poffsets, &cache.cache, layer_idx, max_keys_per_seq, pout,
                                             pworkspace, stream));
  if (check_status(status)) return NULL;
  Py_RETURN_NONE;
}

static PyObject* sparse_prefill(PyObject* self, PyObject* args) {
  PyObject *handle, *stream_obj, *q, *blocks, *scales, *indices, *topk_lengths, *attn_sink, *out, *lse, *workspace;
  int device, layer_idx;
  float softmax_scale;
  if (!PyArg_ParseTuple(args, "OiOOOOOOifOOOO", &handle, &device, &stream_obj, &q, &blocks, &scales, &indices,
                        &topk_lengths, &layer_idx, &softmax_scale, &attn_sink, &out, &lse, &workspace))
    return NULL;
  mlajit_tensor t[5];
  const mlajit_tensor *pq, *pindices, *plengths, *psink, *pout, *plse;
  cache_arg cache;
  mlajit_op op;
  void* stream;
  if (tensor_arg(q, &t[0], &pq) || cache_args(blocks, scales, Py_None, Py_None, &cache) ||
      tensor_arg(indices, &t[1], &pindices) || tensor_arg(topk_lengths, &t[2], &plengths) ||
      tensor_arg(attn_sink, &t[3], &psink) || tensor_arg(out, &t[4], &pout))
    return NULL;
  mlajit_tensor lse_tensor, workspace_tensor;
  const mlajit_tensor* pworkspace;
  if (tensor_arg(lse, &lse_tensor, &plse) || tensor_arg(workspace, &workspace_tensor, &pworkspace) ||
      launch_context(handle, device, stream_obj, &op, &stream))
    return NULL;
  /* The indexer's i32 output is read as the prefill's u32 encoded indices (the same bits). */
  if (t[1].dtype == MLAJIT_I32 && pindices != NULL) t[1].dtype = MLAJIT_U32;
  mlajit_status status;
  CALL_RELEASING_GIL(status, api.sparse_prefill(op, pq, &cache.cache, pindices, plengths, layer_idx, softmax_scale,
                                                psink, pout, plse, pworkspace, stream));
  if (check_status(status)) return NULL;
  Py_RETURN_NONE;
}

/* ---- binding ---------------------------------------------------------------------------------- */

static void* address_of(PyObject* functions, const char* name) {
  PyObject* v = PyDict_GetItemString(functions, name); /* borrowed */
  if (v == NULL) {
    PyErr_Format(PyExc_KeyError, "mlajit._fastcall.bind: no address for %s", name);
    return NULL;
  }
  void* p = PyLong_AsVoidPtr(v);
  if (p == NULL && !PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "mlajit._fastcall.bind: %s is NULL", name);
  return p;
}

static void replace(PyObject** slot, PyObject* value) {
  PyObject* old = *slot;
  Py_INCREF(value);
  *slot = value;
  Py_XDECREF(old);
}

/* bind(functions: {c_name: address}, tensor_type, dtypes: 7-tuple, fields, raw_stream, raise_for) */
static PyObject* bind(PyObject* self, PyObject* args) {
  PyObject *functions, *tensor_type, *dtypes, *fields, *raw_stream, *raise_for;
  if (!PyArg_ParseTuple(args, "O!OOOOO", &PyDict_Type, &functions, &tensor_type, &dtypes, &fields, &raw_stream,
                        &raise_for))
    return NULL;
  if (!PyTuple_Check(dtypes) || PyTuple_Size(dtypes) != NUM_DTYPES) {
    PyErr_SetString(PyExc_ValueError, "mlajit._fastcall.bind: dtypes must be a tuple of 7 (None for absent)");
    return NULL;
  }
  void* f[6];
  static const char* const names[6] = {"mlajit_set_device",         "mlajit_kv_cache_store", "mlajit_kv_cache_gather",
                                       "mlajit_sparse_index_remap", "mlajit_mla_indexer",    "mlajit_sparse_prefill_ws"};
  for (int i = 0; i < 6; ++i) {
    f[i] = address_of(functions, names[i]);
    if (f[i] == NULL) return NULL;
  }
  api.set_device = (set_device_fn)f[0];
  api.kv_cache_store = (store_fn)f[1];
  api.kv_cache_gather = (gather_fn)f[2];
  api.sparse_index_remap = (remap_fn)f[3];
  api.mla_indexer = (indexer_fn)f[4];
  api.sparse_prefill = (prefill_fn)f[5];
  replace(&api.tensor_type, tensor_type);
  for (int i = 0; i < NUM_DTYPES; ++i) replace(&api.dtypes[i], PyTuple_GetItem(dtypes, i));
  replace(&api.fields, fields);
  replace(&api.raw_stream, raw_stream);
  replace(&api.raise_for, raise_for);
  current_device = -1; /* rebinding may point at another library */
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(functions, tensor_type, dtypes, fields, raw_stream, raise_for)"},
    {"kv_cache_store", kv_cache_store, METH_VARARGS,
     "(handle, device, stream, x, input_row_offsets, blocks, scales, lookup_table, cache_lengths, layer_idx, kv_idx, "
     "dropped)"},
    {"kv_cache_gather", kv_cache_gather, METH_VARARGS,
     "(handle, device, stream, blocks, scales, lookup_table, cache_lengths, batch_ids, positions, layer_idx, kv_idx, "
     "y, dropped)"},
    {"sparse_index_remap", sparse_index_remap, METH_VARARGS,
     "(handle, device, stream, indices, input_row_offsets, lookup_table, num_blocks, out)"},
    {"mla_indexer", mla_indexer, METH_VARARGS,
     "(handle, device, stream, q, qs, input_row_offsets, k_blocks, k_scales, k_lookup_table, k_cache_lengths, "
     "layer_idx, max_keys_per_seq, out, workspace)"},
    {"sparse_prefill", sparse_prefill, METH_VARARGS,
     "(handle, device, stream, q, kv_blocks, kv_scales, indices, topk_lengths, layer_idx, softmax_scale, attn_sink, "
     "out, lse, workspace)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcall",
                                    "The eager launch path of mlajit.ops in C (see _launch.py).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastcall(void) {
  name_dtype = PyUnicode_InternFromString("dtype");
  name_shape = PyUnicode_InternFromString("shape");
  name_stride = PyUnicode_InternFromString("stride");
  name_data_ptr = PyUnicode_InternFromString("data_ptr");
  if (!name_dtype || !name_shape || !name_stride || !name_data_ptr) return NULL;
  api.tensor_type = Py_None;
  Py_INCREF(Py_None);
  for (int i = 0; i < NUM_DTYPES; ++i) {
    api.dtypes[i] = Py_None;
    Py_INCREF(Py_None);
  }
  api.fields = Py_None;
  api.raw_stream = Py_None;
  api.raise_for = Py_None;
  Py_INCREF(Py_None);
  Py_INCREF(Py_None);
  Py_INCREF(Py_None);
  return PyModule_Create(&module);
}
