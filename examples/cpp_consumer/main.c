/* The C API from C: a bad spec reports a status and a message. */
#include <stdio.h>
#include <string.h>

#include "mlajit/c_api.h"

int main(void) {
  mlajit_op op = NULL;
  if (mlajit_op_create("{\"op\":\"no_such_op\"}", &op) != MLAJIT_ERROR_INVALID_ARGUMENT) return 1;
  if (strstr(mlajit_last_error(), "no_such_op") == NULL) return 1;
  printf("C consumer: mlajit %s rejected a bad op: %s\n", mlajit_version(), mlajit_last_error());
  return 0;
}
