// Kernel cost of taking uprobes out: N perf-event uprobe links (half of them return probes)
// against uprobe_multi links carrying the same N offsets, dropped from T threads.
// Build: gcc -O0 -fcf-protection=none -pthread -o uprobe_detach uprobe_detach.c
// Run as root: ./uprobe_detach N T [K multi links per thread] [1 = multi only]
// Results on Linux 6.18: docs/overhead.md "Known limits", BENCHMARKS.md section 7.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>
#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <time.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <linux/perf_event.h>

#define F(i) __attribute__((noinline)) int f##i(int x) { return x * (i + 3) + 1; }
#define F8(a) F(a##0) F(a##1) F(a##2) F(a##3) F(a##4) F(a##5) F(a##6) F(a##7)
F8(1) F8(2) F8(3) F8(4) F8(5) F8(6) F8(7) F8(8)
#define P(i) (void*)f##i,
#define P8(a) P(a##0) P(a##1) P(a##2) P(a##3) P(a##4) P(a##5) P(a##6) P(a##7)
static void *fns[] = { P8(1) P8(2) P8(3) P8(4) P8(5) P8(6) P8(7) P8(8) };
#define NF 64

static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static long bpf(int cmd, void *attr, unsigned size){return syscall(SYS_bpf,cmd,attr,size);}

struct insn { uint8_t code; uint8_t regs; int16_t off; int32_t imm; };
static int load_prog(int eat) {
  struct insn prog[2] = {{0xb7,0,0,0},{0x95,0,0,0}}; // r0 = 0; exit
  char lic[] = "GPL";
  uint8_t attr[128]; memset(attr,0,sizeof attr);
  *(uint32_t*)(attr+0)=2; // BPF_PROG_TYPE_KPROBE
  *(uint32_t*)(attr+4)=2; // insn_cnt
  *(uint64_t*)(attr+8)=(uint64_t)prog;
  *(uint64_t*)(attr+16)=(uint64_t)lic;
  *(uint32_t*)(attr+68)=eat; // expected_attach_type
  int fd = bpf(5, attr, sizeof attr);
  if (fd<0) { perror("prog load"); exit(1);}
  return fd;
}
static char exe[4096]; static uint64_t offs[NF]; static uint64_t cookies[NF];
static int multi(int prog, int n, int ret, int pid) {
  uint8_t a[64]; memset(a,0,64);
  *(uint32_t*)(a+0)=prog; *(uint32_t*)(a+8)=48; // BPF_TRACE_UPROBE_MULTI
  *(uint64_t*)(a+16)=(uint64_t)exe; *(uint64_t*)(a+24)=(uint64_t)offs;
  *(uint64_t*)(a+40)=(uint64_t)cookies; *(uint32_t*)(a+48)=n; *(uint32_t*)(a+52)=ret; *(uint32_t*)(a+56)=pid;
  int fd = bpf(28, a, 64);
  if (fd<0) { perror("multi link"); exit(1);}
  return fd;
}
static int utype;
static void perf_link(int prog, int i, int ret, int pid, int *pfd, int *lfd) {
  struct perf_event_attr pa; memset(&pa,0,sizeof pa);
  pa.size=sizeof pa; pa.type=utype; pa.config = ret ? 1 : 0;
  pa.config1=(uint64_t)exe; pa.config2=offs[i];
  *pfd = syscall(SYS_perf_event_open,&pa,pid,-1,-1,PERF_FLAG_FD_CLOEXEC);
  if (*pfd<0){perror("perf_event_open");exit(1);}
  uint8_t a[64]; memset(a,0,64);
  *(uint32_t*)(a+0)=prog; *(uint32_t*)(a+4)=*pfd; *(uint32_t*)(a+8)=41; // BPF_PERF_EVENT
  *lfd = bpf(28,a,64); if(*lfd<0){perror("perf link");exit(1);}
}
struct job { int n; int *fds; double dt; };
static void *closer(void *p){ struct job *j=p; double t=now(); for(int i=0;i<j->n;i++) close(j->fds[i]); j->dt=now()-t; return 0; }

int main(int argc, char **argv) {
  int n = argc>1?atoi(argv[1]):40, threads = argc>2?atoi(argv[2]):1;
  readlink("/proc/self/exe", exe, sizeof exe - 1);
  FILE *f=fopen("/sys/bus/event_source/devices/uprobe/type","r"); fscanf(f,"%d",&utype); fclose(f);
  // file offsets from /proc/self/maps
  for (int i=0;i<NF;i++){ FILE *m=fopen("/proc/self/maps","r"); char line[512];
    while(fgets(line,sizeof line,m)){ unsigned long s,e,o; char perm[8];
      if(sscanf(line,"%lx-%lx %7s %lx",&s,&e,perm,&o)==4 && (unsigned long)fns[i]>=s && (unsigned long)fns[i]<e){ offs[i]=(unsigned long)fns[i]-s+o; break;} }
    fclose(m); cookies[i]=i; }
  pid_t child=fork(); if(!child){ for(;;) pause(); }
  int pp = load_prog(0), pm = load_prog(48);
  // perf: each set: n entry links (perf fd + link fd), per thread
  for (int mode=argc>4?atoi(argv[4]):0; mode<2; mode++) {
    struct job jobs[16]; pthread_t th[16];
    double ta=now();
    for (int t=0;t<threads;t++){
      jobs[t].fds = calloc(2*n+2,sizeof(int)); jobs[t].n=0;
      if(mode==0) for(int i=0;i<n;i++){int pf,lf; perf_link(pp,i,i%2,child,&pf,&lf); jobs[t].fds[jobs[t].n++]=lf; jobs[t].fds[jobs[t].n++]=pf;}
      else { int K=argc>3?atoi(argv[3]):2; for(int k=0;k<K;k++) jobs[t].fds[jobs[t].n++]=multi(pm,n/K,k%2,child); }
    }
    double tb=now();
    for (int t=0;t<threads;t++) pthread_create(&th[t],0,closer,&jobs[t]);
    for (int t=0;t<threads;t++) pthread_join(th[t],0);
    double tc=now();
    printf("%s n=%d threads=%d: attach %.1f ms, detach wall %.1f ms (per thread:", mode?"multi (K links per thread, half ret)":"perf (n links, half ret)", n, threads, (tb-ta)*1e3, (tc-tb)*1e3);
    for (int t=0;t<threads;t++) printf(" %.1f", jobs[t].dt*1e3); printf(")\n");
  }
  kill(child,SIGKILL); return 0;
}
