/* Stored responses (POST /v1/responses with store, previous_response_id, GET and DELETE
 * /v1/responses/{id}): what each response added to its conversation and the response object,
 * in memory, within a byte budget (--responses-store): past it the oldest responses go first.
 * A response continues its previous one, so a conversation is read back along those links;
 * one whose earlier response was evicted or deleted is refused, naming that response, never
 * continued with a gap. Reading a conversation makes its responses the newest (eviction takes
 * the least recently used). Nothing is written to disk: a restart forgets every response.
 *
 * Thread-safe: one mutex, held only to find entries and take references to their texts
 * (refcounted); texts are copied and parsed outside it, so that a reader of a long
 * conversation never holds up the event loop's adds, reads and deletes. Allocations count as
 * the server module's for fault injection. */
#ifndef M3_SERVER_RESP_STORE_H
#define M3_SERVER_RESP_STORE_H

#include <stddef.h>

#include <jansson.h>

#define M3_RESP_STORE_MAX_CHAIN 100000 /* responses read back for one conversation at most */

typedef struct m3_resp_store m3_resp_store;

m3_resp_store *m3_resp_store_new(size_t cap_bytes); /* NULL: out of memory */
/* A conversation read back holds at most this many bytes of stored turns (default: no limit;
 * the server passes --max-body, what the same conversation sent whole could hold). */
void m3_resp_store_set_max_read(m3_resp_store *s, size_t bytes);
void m3_resp_store_free(m3_resp_store *s);

/* Stores response id (continuing prev, NULL: none): turn is the JSON text of an array of chat
 * messages (its input and its output), resp its response object's JSON text, items (NULL:
 * none) the JSON text of its input items as the API lists them; all taken (freed whatever
 * happens). 0 stored, 1 larger than the whole budget (not stored), -1 out of memory. An id
 * already stored is replaced. */
int m3_resp_store_put(m3_resp_store *s, const char *id, const char *prev, char *turn, size_t turn_len, char *resp,
                      size_t resp_len, char *items, size_t items_len);

/* The conversation that ends with response id: every turn from the first, as one new JSON
 * array of chat messages in *msgs. 0; 1 when id or one before it is not stored (*missing, cap
 * bytes, names it); 2 when it is longer than M3_RESP_STORE_MAX_CHAIN responses; 3 when its
 * turns hold more than the max_read bytes; -1 out of memory. */
int m3_resp_store_history(m3_resp_store *s, const char *id, json_t **msgs, char *missing, size_t cap);

/* A copy of response id's JSON text (malloc'd, NUL-terminated; *len its length). NULL when
 * it is not stored (*oom 0) or out of memory (*oom 1). */
char *m3_resp_store_get(m3_resp_store *s, const char *id, size_t *len, int *oom);

/* The same for its input items' JSON text ("[]" when it was stored without). */
char *m3_resp_store_get_items(m3_resp_store *s, const char *id, size_t *len, int *oom);

int m3_resp_store_delete(m3_resp_store *s, const char *id); /* 1 deleted, 0 not stored */

typedef struct m3_resp_store_stats {
    size_t n, bytes, cap;
    unsigned long long evicted; /* responses dropped for room */
} m3_resp_store_stats;
void m3_resp_store_get_stats(m3_resp_store *s, m3_resp_store_stats *st);

#endif
