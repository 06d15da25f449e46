/* Which step shapes a backend stops recording as graphs (CUDA: cu_graph_begin / cu_graph_end in
 * src/backend/cuda/backend.cu). A recording that fails (a scratch buffer had to grow while
 * recording, the capture was invalidated) costs its step nothing: the step's ops are issued again
 * directly, and that run grows what the recording could not. So a key is recorded again at its
 * next step; a key whose recording failed M3_GRAPH_TRIES times is refused (its steps run
 * directly from then on), and only after M3_GRAPH_REFUSE_MAX distinct keys are refused does the
 * process stop recording altogether: one odd shape (a draft pass, say) must not cost every other
 * step its graph. Plain C, shared by the CUDA code and the unit tests. */
#ifndef M3_BACKEND_GRAPH_REFUSE_H
#define M3_BACKEND_GRAPH_REFUSE_H

#include <stdint.h>

enum { M3_GRAPH_TRIES = 2, M3_GRAPH_REFUSE_MAX = 8, M3_GRAPH_FAIL_SLOTS = 32 };

typedef struct m3_graph_fails {
    uint64_t key[M3_GRAPH_FAIL_SLOTS];
    int fails[M3_GRAPH_FAIL_SLOTS]; /* 0: a free slot */
    int refused;                    /* keys that reached M3_GRAPH_TRIES failures */
} m3_graph_fails;

/* 1 when the key's steps are no longer recorded */
static inline int m3_graph_refused(const m3_graph_fails *f, uint64_t key) {
    for (int i = 0; i < M3_GRAPH_FAIL_SLOTS; i++)
        if (f->fails[i] && f->key[i] == key) return f->fails[i] >= M3_GRAPH_TRIES;
    return 0;
}

/* Counts a failed recording of key. Returns 1 when the process should stop recording (the
 * M3_GRAPH_REFUSE_MAX-th refused key), else 0. A full table gives up the slot of a key not
 * refused with the fewest failures; refused keys keep theirs (there are fewer of them than
 * slots, since recording stops at M3_GRAPH_REFUSE_MAX). */
static inline int m3_graph_fail(m3_graph_fails *f, uint64_t key) {
    int s = -1;
    for (int i = 0; i < M3_GRAPH_FAIL_SLOTS && s < 0; i++)
        if (f->fails[i] && f->key[i] == key) s = i;
    for (int i = 0; i < M3_GRAPH_FAIL_SLOTS && s < 0; i++)
        if (!f->fails[i]) s = i;
    if (s < 0) { /* full: the fewest failures among keys not refused */
        for (int i = 0; i < M3_GRAPH_FAIL_SLOTS; i++)
            if (f->fails[i] < M3_GRAPH_TRIES && (s < 0 || f->fails[i] < f->fails[s])) s = i;
        if (s < 0) return 1; /* every slot refused: cannot happen while recording goes on */
        f->fails[s] = 0;
    }
    if (!f->fails[s]) f->key[s] = key;
    if (f->fails[s] >= M3_GRAPH_TRIES) return f->refused >= M3_GRAPH_REFUSE_MAX; /* refused already */
    if (++f->fails[s] == M3_GRAPH_TRIES) f->refused++;
    return f->refused >= M3_GRAPH_REFUSE_MAX;
}

#endif
