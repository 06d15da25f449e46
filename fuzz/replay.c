/* Replays a fuzz target's corpus without libFuzzer: every file named on the command line, or
 * in a directory named there, is passed once to LLVMFuzzerTestOneInput. ctest runs it on
 * fuzz/corpus/NAME in the release and sanitizer builds, so the seeds and every input that once
 * found a bug (kept in the corpus) stay regression tests. A target signals a finding by
 * crashing or aborting; this program returns 0 after the last input. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "replay: cannot open %s\n", path); return -1; }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            else buf = nb;
        }
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "replay: out of memory reading %s\n", path); return -1; }
    /* an exact-size copy, so that ASan sees reads past the input's end */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) { free(buf); return -1; }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st)) { fprintf(stderr, "replay: no such file: %s\n", argv[i]); bad++; continue; }
        if (!S_ISDIR(st.st_mode)) { bad += run_file(argv[i]) != 0; files++; continue; }
        DIR *d = opendir(argv[i]);
        if (!d) { bad++; continue; }
        char **names = NULL;
        size_t nn = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char **nm = realloc(names, (nn + 1) * sizeof *nm);
            if (!nm) break;
            names = nm;
            size_t l = strlen(argv[i]) + strlen(e->d_name) + 2;
            if (!(names[nn] = malloc(l))) break;
            snprintf(names[nn++], l, "%s/%s", argv[i], e->d_name);
        }
        closedir(d);
        qsort(names, nn, sizeof *names, cmp); /* a fixed order: reproducible */
        for (size_t j = 0; j < nn; j++) {
            bad += run_file(names[j]) != 0;
            files++;
            free(names[j]);
        }
        free(names);
    }
    printf("replayed %d inputs%s\n", files, bad ? " (some could not be read)" : "");
    return bad || !files ? 1 : 0;
}
