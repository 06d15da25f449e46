/* Safetensors reader (mmap, single file or sharded via model.safetensors.index.json) and
 * writer. Every header is validated: offsets inside the file, size = dtype x shape, no two
 * tensors overlapping. Tensor data stays in the mapping; nothing is copied. */
#ifndef M3_SAFETENSORS_H
#define M3_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../base/err.h"

typedef enum {
    M3_DT_F32, M3_DT_F16, M3_DT_BF16, M3_DT_F64, M3_DT_F8_E4M3, M3_DT_F8_E5M2,
    M3_DT_U8, M3_DT_I8, M3_DT_I16, M3_DT_U16, M3_DT_I32, M3_DT_U32, M3_DT_I64, M3_DT_U64,
    M3_DT_BOOL, M3_DT_COUNT
} m3_dtype;

#define M3_MAX_DIMS 8

typedef struct m3_tensor {
    char *name;
    m3_dtype dtype;
    int ndim;
    int64_t shape[M3_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    const void *data;  /* inside the file mapping */
    int file;          /* index of the shard that holds it */
} m3_tensor;

typedef struct m3_st m3_st;

const char *m3_dtype_name(m3_dtype t);
size_t m3_dtype_size(m3_dtype t);
int m3_dtype_parse(const char *s, m3_dtype *out);

/* path: a .safetensors file, a model.safetensors.index.json, or a directory holding either. */
m3_st *m3_st_open(const char *path, m3_err *err);
void m3_st_close(m3_st *st);

const m3_tensor *m3_st_find(const m3_st *st, const char *name);
size_t m3_st_count(const m3_st *st);
const m3_tensor *m3_st_at(const m3_st *st, size_t i);
size_t m3_st_nfiles(const m3_st *st);
const char *m3_st_file_path(const m3_st *st, int file);
uint64_t m3_st_total_bytes(const m3_st *st);

/* "[a, b, c]" for messages. */
void m3_shape_str(const int64_t *shape, int ndim, char *buf, size_t n);

/* Writer: collect tensors (data is copied at write time, not at add time), then write. */
typedef struct m3_st_writer m3_st_writer;
m3_st_writer *m3_stw_new(void);
/* data must stay valid until m3_stw_write; returns -1 on bad arguments. */
int m3_stw_add(m3_st_writer *w, const char *name, m3_dtype dt, int ndim, const int64_t *shape,
               const void *data, m3_err *err);
int m3_stw_write(m3_st_writer *w, const char *path, m3_err *err);
void m3_stw_free(m3_st_writer *w);

#endif
