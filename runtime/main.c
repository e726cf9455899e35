/*
 * main.c — the berth command (everything else is in libberth: cli.c).
 */
#include "cli.h"

int main(int argc, char **argv)
{
  return berth_cli_main(argc, argv);
}
