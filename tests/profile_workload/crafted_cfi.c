/* A program whose call frame information lies, as a hostile binary's may: each of its three
 * spin functions describes its own frame wrongly. Walking its stacks must cut them, counted by
 * reason, and leave the walks of every other process as they were. Runs rounds of the three
 * until its standard input ends. Built without frame pointers. */
#include <poll.h>
#include <unistd.h>

void spin_cfa_at_sp(long n);
void spin_ra_far(long n);
void spin_cfa_expression(long n);

__asm__(
    ".text\n"
    /* CFA = rsp: the caller's frame would not be above this one's (bad_frame). The word
       below rsp, where the return address would be, is made non-zero. */
    ".globl spin_cfa_at_sp\n"
    ".type spin_cfa_at_sp, @function\n"
    "spin_cfa_at_sp:\n"
    ".cfi_startproc\n"
    ".cfi_def_cfa_offset 0\n"
    "  movq $1, -8(%rsp)\n"
    "1:\n"
    "  subq $1, %rdi\n"
    "  jnz 1b\n"
    "  ret\n"
    ".cfi_endproc\n"
    ".size spin_cfa_at_sp, .-spin_cfa_at_sp\n"
    /* CFA = rsp + 1 GiB: the return address is read where nothing is mapped (unreadable). */
    ".globl spin_ra_far\n"
    ".type spin_ra_far, @function\n"
    "spin_ra_far:\n"
    ".cfi_startproc\n"
    ".cfi_def_cfa_offset 1073741824\n"
    "1:\n"
    "  subq $1, %rdi\n"
    "  jnz 1b\n"
    "  ret\n"
    ".cfi_endproc\n"
    ".size spin_ra_far, .-spin_ra_far\n"
    /* CFA = an expression (rsp + 8, computed: DW_CFA_def_cfa_expression DW_OP_breg7 0
       DW_OP_lit8 DW_OP_plus): a form the walk does not follow (unsupported). */
    ".globl spin_cfa_expression\n"
    ".type spin_cfa_expression, @function\n"
    "spin_cfa_expression:\n"
    ".cfi_startproc\n"
    ".cfi_escape 0x0f, 0x04, 0x77, 0x00, 0x38, 0x22\n"
    "1:\n"
    "  subq $1, %rdi\n"
    "  jnz 1b\n"
    "  ret\n"
    ".cfi_endproc\n"
    ".size spin_cfa_expression, .-spin_cfa_expression\n");

/* Whether standard input has ended (or has something): poll without waiting. */
static int input_ended(void) {
  struct pollfd in = {.fd = STDIN_FILENO, .events = POLLIN};

  return poll(&in, 1, 0) > 0;
}

int main(void) {
  while (!input_ended()) {
    spin_cfa_at_sp(20000000);
    spin_ra_far(20000000);
    spin_cfa_expression(20000000);
  }
  return 0;
}
