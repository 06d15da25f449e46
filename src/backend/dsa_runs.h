/* The DSpark draft attention's runs (k_dsa_flash, src/backend/cuda/dspark_attention.cu): a
 * launch takes nreq requests of chunks[r] 64-key chunks each and nkv KV heads; a CTA takes a run
 * of at most `per` consecutive chunks of one (request, KV head), so request r needs
 * nkv * ceil(chunks[r] / per) CTAs and the grid's x is the most runs of any request. per is the
 * shortest run whose CTAs fit one wave of `sms` CTAs (one an SM), or a request's whole chunks
 * when none does. Plain C, shared by the CUDA code and the unit tests. */
#ifndef M3_BACKEND_DSA_RUNS_H
#define M3_BACKEND_DSA_RUNS_H

/* returns the grid's x (the most runs of a request), *per the run length */
static inline int m3_dsa_runs(int sms, int nkv, int nreq, const int *chunks, int *per) {
    long tot = 0;
    int most = 1;
    for (int r = 0; r < nreq; r++) {
        tot += chunks[r];
        if (chunks[r] > most) most = chunks[r];
    }
    const long waves = sms > 0 ? sms : 1;
    int p = (int)((tot * nkv + waves - 1) / waves); /* no run can be shorter and fit */
    if (p < 1) p = 1;
    for (; p < most; p++) {
        long ctas = 0;
        for (int r = 0; r < nreq; r++) ctas += (long)nkv * ((chunks[r] + p - 1) / p);
        if (ctas <= sms) break;
    }
    if (p > most) p = most;
    *per = p;
    return (most + p - 1) / p;
}

#endif
