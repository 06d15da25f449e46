/* Image inputs for the CLI (m3 logits --image / --pixel-values): load the vision tower,
 * decode + preprocess the files (or read the pixel values), run the tower, expand the
 * prompt's image placeholders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../backend/cpu/cpu.h"
#include "../tokenizer/tokenizer.h"
#include "cli.h"

void m3_cli_images_free(m3_cli_images *im) {
    m3_vision_free(&im->vis);
    m3_pixels_free(&im->px);
    free(im->embeds);
    free(im->tower_out);
    free(im->rows);
    memset(im, 0, sizeof *im);
}

/* ]<]start of image[>[ / ]<]end of image[>[ from the checkpoint's tokenizer, when it has one */
static void marker_ids(const char *dir, int32_t *start, int32_t *end) {
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (stat(path, &sb) != 0) return;
    m3_err err;
    m3_tok *t = m3_tok_load(dir, &err);
    if (!t) return;
    if (*start < 0) *start = m3_tok_token_to_id(t, "]<]start of image[>[");
    if (*end < 0) *end = m3_tok_token_to_id(t, "]<]end of image[>[");
    m3_tok_free(t);
}

int m3_cli_images_prepare(m3_cli_images *im, m3_model *m, m3_ops *ops, const char *dir, const char *const *files,
                          int n_files, const char *pixel_file, int language_only, int32_t start_id, int32_t end_id,
                          int threads, int32_t **ids, int *T, const char *cmd) {
    memset(im, 0, sizeof *im);
    m3_err err;
    m3_ops cpu_ops;
    int own_ops = 0, rc = -1, *counts = NULL;
    if (language_only) {
        fprintf(stderr, "m3 %s: --image / --pixel-values need the vision tower (drop --language-model-only)\n", cmd);
        return -1;
    }
    if (m3_vision_load(&im->vis, dir, m->st, &err)) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); goto done; }
    if (!im->vis.present) { fprintf(stderr, "m3 %s: %s has no vision tower (a text-only checkpoint)\n", cmd, dir); goto done; }
    const m3_vision_config *vc = &im->vis.cfg;
    if (vc->text_hidden != m->cfg.hidden) {
        fprintf(stderr, "m3 %s: vision config text hidden size %d differs from the text model's %d\n", cmd, vc->text_hidden, m->cfg.hidden);
        goto done;
    }
    if (pixel_file) {
        if (m3_pixels_load(pixel_file, &im->px, &err)) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); goto done; }
    } else {
        m3_image_opts o;
        m3_image_opts_default(&o);
        o.patch = vc->patch;
        o.temporal = vc->temporal;
        o.merge = vc->merge;
        if (m3_image_opts_load(&o, dir, &err)) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); goto done; }
        for (int i = 0; i < n_files; i++) {
            m3_rgb img;
            if (m3_image_load_file(files[i], o.max_input_pixels, &img, &err)) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); goto done; }
            int r = m3_image_preprocess(&img, &o, &im->px, &err);
            m3_rgb_free(&img);
            if (r) { fprintf(stderr, "m3 %s: %s: %s\n", cmd, files[i], err.msg); goto done; }
        }
    }
    int ntok = m3_vision_check_pixels(vc, &im->px, &err);
    if (ntok < 0) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); goto done; }
    im->n_tokens = ntok;
    im->embeds = malloc(sizeof(float) * (size_t)ntok * vc->text_hidden);
    im->tower_out = malloc(sizeof(float) * (size_t)im->px.n_patches * vc->hidden);
    counts = malloc(sizeof(int) * (size_t)im->px.n_images);
    if (!im->embeds || !im->tower_out || !counts) { fprintf(stderr, "m3 %s: out of memory\n", cmd); goto done; }
    for (int i = 0; i < im->px.n_images; i++) counts[i] = m3_vision_image_tokens(vc, im->px.grid + 3 * i);
    /* the tower runs on the model's ops (a device backend on a copy of its weights), or on a CPU
     * op table of its own where they have no vision ops or M3_VISION_CPU=1 */
    m3_ops *vops = ops;
    const char *vcpu = getenv("M3_VISION_CPU");
    if (ops->device_memory && (!ops->attention_full || (vcpu && atoi(vcpu) == 1))) {
        if (m3_cpu_ops_init(&cpu_ops, threads, &err)) { fprintf(stderr, "m3 %s: %s\n", cmd, err.msg); goto done; }
        own_ops = 1;
        vops = &cpu_ops;
    }
    m3_vision dev = {0};
    if (vops->device_memory && m3_vision_upload(&im->vis, vops, &dev, &err)) {
        fprintf(stderr, "m3 %s: vision tower: %s\n", cmd, err.msg);
        goto done;
    }
    int vrc = m3_vision_encode(vops->device_memory ? &dev : &im->vis, vops, &im->px, im->embeds, im->tower_out, &err);
    if (vops->device_memory) m3_vision_release(&dev, vops);
    if (vrc) {
        fprintf(stderr, "m3 %s: vision tower: %s\n", cmd, err.msg);
        goto done;
    }
    if (start_id < 0 || end_id < 0) marker_ids(dir, &start_id, &end_id);
    int32_t *nids;
    int nT;
    if (m3_vision_expand_prompt(*ids, *T, vc->image_token, start_id, end_id, counts, im->px.n_images, &nids, &nT, &im->rows,
                                &err)) {
        fprintf(stderr, "m3 %s: %s\n", cmd, err.msg);
        goto done;
    }
    for (int i = 0; i < nT; i++)
        if (nids[i] < 0 || nids[i] >= m->cfg.vocab) {
            fprintf(stderr, "m3 %s: token id %d at index %d of the expanded prompt is out of range (vocab %d)\n", cmd, nids[i], i, m->cfg.vocab);
            free(nids);
            goto done;
        }
    free(*ids);
    *ids = nids;
    *T = nT;
    im->n_rows = ntok;
    rc = 0;
done:
    free(counts);
    if (own_ops) m3_cpu_ops_free(&cpu_ops);
    if (rc) m3_cli_images_free(im);
    return rc;
}
