/* kvf plan: placeholder until sim/plan.c lands. */
#include <stdio.h>

#include "commands.h"

int kvf_cmd_plan(int argc, char **argv)
{
    (void)argc;
    fprintf(stderr, "%s: not built yet\n", argv[0]);
    return 2;
}
