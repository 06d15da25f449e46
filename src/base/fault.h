/* Allocation-failure injection, for tests.
 *
 * A test arms a module; from then on the module's counted allocations are numbered 1, 2, ...
 * and the chosen ones fail (return NULL) as if memory had run out: number `first`, then every
 * `period`-th one after it, `count` failures in all (count < 0: no end). The module must then
 * answer with a clean error (an error code, a request ended with M3_FINISH_ERROR, an HTTP
 * 500) and leak nothing. tests/reliability/ sweeps `first` over every allocation of a
 * scenario (the engine), and over a running server (`m3 serve` reads M3_FAULT_ALLOC).
 *
 * What is counted: the allocations a module routes through m3_fault_malloc / calloc /
 * realloc: the engine's request, queue and sampler allocations (engine.c, sampler.c); the
 * server's request state, output buffers and queue, and (only while the server module is
 * armed, see m3_fault_json_hook) every jansson allocation of the process; the CPU backend's
 * op scratch (m3_cpu_scratch: a failure there fails the forward pass through the op table's
 * check). Never the per-element work of a kernel: disarmed, a counted allocation costs one
 * relaxed atomic load.
 *
 * State is process-wide by necessity (an allocation site carries no context); it is never
 * armed outside tests. Thread-safe: counters are atomics; arm and disarm while the module is
 * quiet if the numbering has to be exact. */
#ifndef M3_ENGINE_FAULT_H
#define M3_ENGINE_FAULT_H

#include <stddef.h>

#include "err.h"

/* device: not an allocation but the CPU backend's recovery after a failed step (ops.recover);
 * a hit there reports the device lost, as a CUDA error that sticks to the context would */
/* graph: not an allocation but the end of a CUDA graph recording (cu_graph_end): a hit fails the
 * recording as an invalidated capture would (the step's ops then run directly) */
typedef enum {
    M3_FAULT_ENGINE = 0,
    M3_FAULT_SERVER = 1,
    M3_FAULT_BACKEND = 2,
    M3_FAULT_DEVICE = 3,
    M3_FAULT_GRAPH = 4,
    M3_FAULT_NMOD = 5
} m3_fault_module;

/* Arms module m: allocation number first (>= 1), and every period-th after it (period >= 1),
 * fails, count failures in all (< 0: unbounded; 0: only count allocations). Resets the
 * module's counters. */
void m3_fault_arm(m3_fault_module m, long first, long count, long period);
void m3_fault_disarm(m3_fault_module m);
/* "MODULE:FIRST[:COUNT[:PERIOD]]" entries separated by commas (MODULE: engine | server | backend | device | graph;
 * COUNT defaults to 1, PERIOD to 1), e.g. "server:200:40:97,engine:5". 0, or -1 + err. */
int m3_fault_arm_spec(const char *spec, m3_err *err);
int m3_fault_armed(m3_fault_module m);
const char *m3_fault_module_name(m3_fault_module m); /* "engine", "server", "backend", "device" (the spec's names) */
long m3_fault_seen(m3_fault_module m);   /* counted allocations since armed */
long m3_fault_failed(m3_fault_module m); /* failures injected since armed */

/* 1 when this allocation of module m is to fail (counts it when armed). */
int m3_fault_hit(m3_fault_module m);
void *m3_fault_malloc(m3_fault_module m, size_t n);
void *m3_fault_calloc(m3_fault_module m, size_t k, size_t n);
void *m3_fault_realloc(m3_fault_module m, void *p, size_t n);

/* Suspends (on: 1) or resumes (0) injection on the calling thread; nests. For code that
 * does not survive a failed allocation and is not ours: jansson's parser (json_loadb) drops
 * an allocation failure in its lexer and then asserts or reads past its buffer
 * (akheron/jansson#362, open in 2.14), so the server parses request bodies, and runs the
 * tool-call parser (which parses argument values), with injection suspended. Allocations
 * made while suspended are not counted. */
void m3_fault_suspend(int on);

/* Routes jansson's allocations through the server module's counter (on: 1) or back to
 * malloc / free (0). Call while no JSON value is alive that was made under the other
 * setting's allocator only if both free with free() (they do). */
void m3_fault_json_hook(int on);

#endif
