/*
 * connguard.c — the connection guard of `berth serve`: the very code sandboxd uses
 * (sandboxd/connguard.c, self-contained for this), built into libberth from here.
 */
#include "../sandboxd/connguard.c"
