/* JSON Schema "format" for strings (grammar_int.h: schema_format_regex): the formats OpenAI's
 * structured outputs serve, each as an ECMAScript pattern (regex.c) its strings match whole.
 * Each pattern writes a subset of what its standard allows (every string it admits is valid;
 * not every valid string is admitted), chosen so that any output ends:
 *   date       RFC 3339 full-date, days checked against the month and leap years
 *   time       RFC 3339 full-time: HH:MM:SS, 1-9 fraction digits, Z or +-HH:MM (no leap second)
 *   date-time  date "T" time
 *   duration   RFC 3339 appendix A (ISO 8601) durations, components of 1-9 digits
 *   email      dot-atoms of [A-Za-z0-9_%+-] (at most 4 of 15 characters) @ 1-3 hostname labels
 *              and a 2-24 letter top-level label
 *   hostname   RFC 1123: 1-3 labels of 1-63 characters, letters, digits and inner hyphens
 *   ipv4       dotted quad, 0-255 without leading zeros
 *   ipv6       RFC 4291 text forms of 8 groups, :: compression included (no embedded IPv4)
 *   uuid       RFC 4122 8-4-4-4-12 hex digits */
#include <string.h>

#include "grammar/grammar_int.h"

#define DATE                                                                                                           \
    "(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|"           \
    "02-(?:0[1-9]|1[0-9]|2[0-8]))|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)"
#define TIME "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
#define NUM "[0-9]{1,9}"
#define DUR_TIME "T(?:" NUM "H(?:" NUM "M(?:" NUM "S)?)?|" NUM "M(?:" NUM "S)?|" NUM "S)"
#define DUR_DATE "(?:" NUM "D|" NUM "M(?:" NUM "D)?|" NUM "Y(?:" NUM "M(?:" NUM "D)?)?)(?:" DUR_TIME ")?"
#define LABEL "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
#define H16 "[0-9a-fA-F]{1,4}"

static const char *const formats[][2] = {
    {"date", DATE},
    {"time", TIME},
    {"date-time", DATE "T" TIME},
    {"duration", "P(?:" DUR_DATE "|" DUR_TIME "|" NUM "W)"},
    {"email", "[A-Za-z0-9_%+-]{1,15}(?:\\.[A-Za-z0-9_%+-]{1,15}){0,3}@(?:" LABEL "\\.){1,3}[A-Za-z]{2,24}"},
    {"hostname", LABEL "(?:\\." LABEL "){0,2}"},
    {"ipv4", "(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"},
    {"ipv6", "(?:" H16 ":){7}" H16 "|(?:" H16 ":){1,7}:|(?:" H16 ":){1,6}:" H16 "|(?:" H16 ":){1,5}(?::" H16 "){1,2}|(?:" H16
             ":){1,4}(?::" H16 "){1,3}|(?:" H16 ":){1,3}(?::" H16 "){1,4}|(?:" H16 ":){1,2}(?::" H16 "){1,5}|" H16 ":(?::" H16
             "){1,6}|:(?:(?::" H16 "){1,7}|:)"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
};

const char *schema_format_regex(const char *name) {
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        if (!strcmp(name, formats[i][0])) return formats[i][1];
    return NULL;
}

const char *schema_format_names(void) { return "date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid"; }
