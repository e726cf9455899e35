/*
 * main.c — the berth command (everything else is in libberth: cli.c).
 */
#include "cli.h"

#include <string.h>

int berth_cmd_verify(int argc, char **argv); /* verify.c */

int main(int argc, char **argv)
{
  if (argc >= 2 && strcmp(argv[1], "verify") == 0)
    return berth_cmd_verify(argc - 1, argv + 1);
  return berth_cli_main(argc, argv);
}
