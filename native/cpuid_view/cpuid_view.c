/* A CPUID view: this process, and every process it forks, sees a CPU of a lower x86-64 class.

   Benchmarks run under it to measure as on a machine without AVX-512 (benchmarks/cpu_view.py,
   docs/notes/benchmarks-history.md "Measuring as an AVX2-only machine"). Linux's CPUID faulting
   (arch_prctl ARCH_SET_CPUID, the `cpuid_fault` flag of /proc/cpuinfo) makes every `cpuid`
   instruction of the process trap; the handler below runs the real one and clears the feature
   bits the class lacks, so ONNX Runtime's MLAS, PyTorch, oneDNN, MKL, numpy and uform's op
   library all choose the kernels they would choose on such a machine. The hardware still runs
   every instruction: a library that executes AVX-512 without asking is not caught.

   A plain shared object (no Python API), loaded with ctypes before any library that asks the
   CPU what it runs. The setting survives fork and clone and is reset by execve, so each Python
   process of a benchmark turns it on at startup (benchmarks/cpu_view_site/sitecustomize.py). */

#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define BIT(n) (1u << (n))

/* What each view clears, by leaf 7's registers (subleaf 0: ebx, ecx, edx; subleaf 1: eax, edx). */
struct hidden {
  unsigned ebx7, ecx7, edx7, eax71, edx71;
};

/* x86-64-v4 keeps AVX-512 F/BW/CD/DQ/VL and hides what came after them: VNNI, BF16, FP16, the
   newer AVX-512 extensions, AMX, AVX10 and the VEX forms of VNNI and IFMA. */
static const struct hidden ABOVE_V4 = {
    BIT(21),                                                           /* AVX512_IFMA */
    BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14),                     /* VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
    BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25),  /* 4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, FP16, AMX_TILE, AMX_INT8 */
    BIT(4) | BIT(5) | BIT(23),                                         /* AVX_VNNI, AVX512_BF16, AVX_IFMA */
    BIT(4) | BIT(5) | BIT(10) | BIT(19),                               /* AVX_VNNI_INT8, AVX_NE_CONVERT, AVX_VNNI_INT16, AVX10 */
};
/* x86-64-v4+vnni+bf16 hides only AMX: an AMX CPU seen as the class below it. */
static const struct hidden AMX = {0, 0, BIT(22) | BIT(24) | BIT(25), 0, 0}; /* AMX_BF16, AMX_TILE, AMX_INT8 */
/* x86-64-v3 hides AVX-512 as a whole besides: F, DQ, PF, ER, CD, BW, VL (leaf 7, ebx). */
static const unsigned AVX512_EBX7 = BIT(16) | BIT(17) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31);

static struct hidden hide;
static struct sigaction previous;
static volatile long answered;

static void on_fault(int sig, siginfo_t *info, void *raw) {
  ucontext_t *context = raw;
  greg_t *r = context->uc_mcontext.gregs;
  const unsigned char *at = (const unsigned char *)r[REG_RIP];
  if (info->si_code != SI_KERNEL || at[0] != 0x0f || at[1] != 0xa2) {  /* not a cpuid: a real fault */
    sigaction(SIGSEGV, &previous, NULL);                                /* returning re-runs it there */
    return;
  }
  unsigned leaf = (unsigned)r[REG_RAX], subleaf = (unsigned)r[REG_RCX], a, b, c, d;
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
  __cpuid_count(leaf, subleaf, a, b, c, d);
  syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
  if (leaf == 7 && subleaf == 0) {
    b &= ~hide.ebx7;
    c &= ~hide.ecx7;
    d &= ~hide.edx7;
  } else if (leaf == 7 && subleaf == 1) {
    a &= ~hide.eax71;
    d &= ~hide.edx71;
  }
  r[REG_RAX] = a;
  r[REG_RBX] = b;
  r[REG_RCX] = c;
  r[REG_RDX] = d;
  r[REG_RIP] += 2;
  answered += 1;
  (void)sig;
}

/* Turns the view of x86-64-v`level` (3 or 4; 5: x86-64-v4+vnni+bf16, AMX hidden) on for this
   process: 0, or an errno (EINVAL for another level; ENODEV where the CPU or kernel has no
   CPUID faulting). */
int uform_cpuid_view(int level) {
  if (level != 3 && level != 4 && level != 5) return EINVAL;
  hide = level == 5 ? AMX : ABOVE_V4;
  if (level == 3) hide.ebx7 |= AVX512_EBX7;
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGSEGV, &action, &previous) != 0) return errno;
  if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {  /* ENODEV: no CPUID faulting here */
    int failed = errno;
    sigaction(SIGSEGV, &previous, NULL);
    return failed;
  }
  return 0;
}

/* How many cpuid instructions the view has answered in this process. */
long uform_cpuid_view_answered(void) { return answered; }
