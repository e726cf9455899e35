/*
 * details.h — the binary protobuf of the three plimsoll error details (docs/wire.md §6.2),
 * base64 without padding as Connect carries them.
 */
#ifndef SBX_DETAILS_H
#define SBX_DETAILS_H

#include "plimsoll.h"

/* Each returns the detail's `value` (malloc'd base64, no padding). */
char *sbx_detail_not_dispatched(plm_refusal reason);
char *sbx_detail_session_ended(plm_session_end end, const char *detail);
char *sbx_detail_unanswered(const plm_record *rec);

#endif
