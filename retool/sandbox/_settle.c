/* An execution process's setup in one native call: the same system calls, in the same order, as
 * child.main and child._settle_layers make from Python before the job arrives (detach, descriptors, the
 * memory baseline, stdin's memfd, directory, scheduling, stdio, credentials, Landlock, seccomp).
 *
 * Why native: an execution is a fresh fork of a warm interpreter, so every Python object the setup
 * touches (a function, its constants, the ints and tuples of each ctypes call) costs a
 * copy-on-write page fault; made from Python, the setup is ~2 ms of CPU and ~500 faults per
 * request, most of it faults (bench/RESULTS.md, "where the time goes"). Made here it touches the
 * arguments and a few kilobytes of C stack. Decisions stay in Python: what to apply is decided and
 * encoded once per zygote (child.pack_native_plan: the Landlock ruleset and rules, the seccomp
 * program and where its pid goes, the OOM score and nice value), and this only applies it. The Python path stays beside
 * it (built without a compiler, or `native_setup: false`); tests run both and compare the states
 * they leave.
 *
 * settle(plan, cwd, zygote, go_fd, stdout_fd, stderr_fd, ack_fd, drop, uid, gid, dumpable)
 *     -> (baseline_vm_bytes, stdin_fd)
 * Raises OSError(errno, "<step>: <strerror>") naming the step that failed; the caller reports it
 * and exits without acknowledging its setup. Linux only.
 *
 * reseed(regions): fresh states for the interpreter's random generators (retool/sandbox/reseed.py
 * says which, where their states lie and why this is their seeding from the OS): for each (state
 * address, index address, index value), the first word 0x80000000, the other 623 from getrandom,
 * and the index at its value. Raises OSError when getrandom fails.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

/* The generic syscall table's numbers, the same on x86_64 and aarch64 (as landlock.py and
 * child.CloseRange use them). */
#define NR_CLOSE_RANGE 436
#define NR_LANDLOCK_CREATE_RULESET 444
#define NR_LANDLOCK_ADD_RULE 445
#define NR_LANDLOCK_RESTRICT_SELF 446
#define LANDLOCK_RULE_PATH_BENEATH 1

#define PLAN_VERSION 3u
#define PLAN_HEADER 56 /* 8 x u32, 2 x s32, then 2 x u64 */
#define RULE_BYTES 12  /* struct landlock_path_beneath_attr, packed: u64 allowed_access, s32 parent_fd */
#define FLAG_LANDLOCK 1u
#define FLAG_SECCOMP 2u
#define MAX_KEEP 256

typedef struct {
    uint32_t abi, attr_len, n_rules, n_instructions, n_own, n_group, flags;
    int32_t oom_score_adj, nice;
    uint64_t write_access, file_rights;
    const unsigned char *attr, *rules, *program, *own, *group;
} plan_t;

static PyObject *fail(const char *step) {
    int err = errno;
    char message[256];
    snprintf(message, sizeof message, "%s: %s", step, strerror(err));
    PyObject *exc = PyObject_CallFunction(PyExc_OSError, "is", err, message);
    if (exc != NULL) {
        PyErr_SetObject(PyExc_OSError, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static uint32_t u32_at(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static uint64_t u64_at(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The plan child.pack_native_plan wrote: header, ruleset attribute, rules, program, pid positions. */
static int parse_plan(const unsigned char *data, Py_ssize_t size, plan_t *plan) {
    if (size < PLAN_HEADER || u32_at(data) != PLAN_VERSION)
        goto bad;
    plan->abi = u32_at(data + 4);
    plan->attr_len = u32_at(data + 8);
    plan->n_rules = u32_at(data + 12);
    plan->n_instructions = u32_at(data + 16);
    plan->n_own = u32_at(data + 20);
    plan->n_group = u32_at(data + 24);
    plan->flags = u32_at(data + 28);
    plan->oom_score_adj = (int32_t)u32_at(data + 32);
    plan->nice = (int32_t)u32_at(data + 36);
    plan->write_access = u64_at(data + 40);
    plan->file_rights = u64_at(data + 48);
    uint64_t need = (uint64_t)PLAN_HEADER + plan->attr_len + (uint64_t)plan->n_rules * RULE_BYTES +
                    (uint64_t)plan->n_instructions * sizeof(struct sock_filter) + 4ull * plan->n_own + 4ull * plan->n_group;
    if (need != (uint64_t)size || plan->n_rules > MAX_KEEP - 4 || plan->n_instructions > BPF_MAXINSNS)
        goto bad;
    const unsigned char *p = data + PLAN_HEADER;
    plan->attr = p;
    p += plan->attr_len;
    plan->rules = p;
    p += (size_t)plan->n_rules * RULE_BYTES;
    plan->program = p;
    p += (size_t)plan->n_instructions * sizeof(struct sock_filter);
    plan->own = p;
    p += 4u * plan->n_own;
    plan->group = p;
    for (uint32_t i = 0; i < plan->n_own; i++)
        if (u32_at(plan->own + 4u * i) >= plan->n_instructions)
            goto bad;
    for (uint32_t i = 0; i < plan->n_group; i++)
        if (u32_at(plan->group + 4u * i) >= plan->n_instructions)
            goto bad;
    return 0;
bad:
    PyErr_SetString(PyExc_ValueError, "settle: the plan is not one child.pack_native_plan wrote");
    return -1;
}

static int rule_fd(const plan_t *plan, uint32_t i) {
    int32_t fd;
    memcpy(&fd, plan->rules + (size_t)i * RULE_BYTES + 8, sizeof fd);
    return fd;
}

/* isolation.die_with_parent: SIGKILL when the zygote dies; already reparented means it died. */
static int die_with_parent(pid_t zygote) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        return -1;
    if (getppid() != zygote)
        _exit(1);
    return 0;
}

static int compare_fds(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

/* child._close_other_fds: close_range(2) over each gap between the kept descriptors, or, where
 * the kernel or a seccomp profile refuses the syscall, every listed /proc/self/fd entry. */
static int close_other_fds(int *keep, size_t n_keep) {
    qsort(keep, n_keep, sizeof *keep, compare_fds);
    unsigned int low = 3;
    int refused = 0;
    for (size_t i = 0; i < n_keep && !refused; i++) {
        if (keep[i] < (int)low)
            continue;
        if ((unsigned int)keep[i] > low && syscall(NR_CLOSE_RANGE, low, (unsigned int)keep[i] - 1, 0) != 0)
            refused = 1;
        low = (unsigned int)keep[i] + 1;
    }
    if (!refused && syscall(NR_CLOSE_RANGE, low, ~0u, 0) == 0)
        return 0;
    if (errno != ENOSYS && errno != EPERM && errno != EACCES)
        return -1;
    DIR *dir = opendir("/proc/self/fd");
    if (dir == NULL)
        return -1;
    int listed[4096];
    size_t n_listed = 0;
    int walked_all = 0;
    while (!walked_all) {
        struct dirent *entry;
        n_listed = 0;
        rewinddir(dir);
        walked_all = 1;
        while ((entry = readdir(dir)) != NULL) {
            if (entry->d_name[0] < '0' || entry->d_name[0] > '9')
                continue;
            if (n_listed == sizeof listed / sizeof *listed) {
                walked_all = 0; /* more than fit: close these, then list again */
                break;
            }
            listed[n_listed++] = atoi(entry->d_name);
        }
        int dir_fd = dirfd(dir);
        for (size_t i = 0; i < n_listed; i++) {
            int fd = listed[i];
            if (fd <= 2 || fd == dir_fd || bsearch(&fd, keep, n_keep, sizeof *keep, compare_fds) != NULL)
                continue;
            close(fd);
        }
    }
    closedir(dir);
    return 0;
}

static long baseline_vm_bytes(void) {
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    char buffer[256];
    ssize_t n = read(fd, buffer, sizeof buffer - 1);
    int err = errno;
    close(fd);
    if (n <= 0) {
        errno = n == 0 ? EIO : err;
        return -1;
    }
    buffer[n] = '\0';
    return strtol(buffer, NULL, 10) * sysconf(_SC_PAGESIZE);
}

/* child._yield_to_the_server: the OOM killer's first choice, then nice; failures ignored there too. */
static int yield_to_the_server(const plan_t *plan) {
    if (prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0)
        return -1;
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        char score[16];
        int length = snprintf(score, sizeof score, "%d", plan->oom_score_adj);
        (void)!write(fd, score, (size_t)length);
        close(fd);
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0)
        return -1;
    (void)setpriority(PRIO_PROCESS, 0, plan->nice);
    return 0;
}

/* landlock.PreparedRules.restrict_self(write=(cwd,)), then .close(). */
static const char *landlock(const plan_t *plan, const char *cwd) {
    const char *step = NULL;
    int ruleset = (int)syscall(NR_LANDLOCK_CREATE_RULESET, plan->attr, (size_t)plan->attr_len, 0u);
    if (ruleset < 0) {
        step = "landlock create_ruleset";
        goto out;
    }
    for (uint32_t i = 0; i < plan->n_rules; i++) {
        if (syscall(NR_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, plan->rules + (size_t)i * RULE_BYTES, 0u) != 0) {
            step = "landlock add_rule (a read path or device)";
            goto out;
        }
    }
    int dir = open(cwd, O_PATH | O_CLOEXEC);
    if (dir < 0) {
        errno = ENOENT;
        step = "landlock: the execution directory does not exist";
        goto out;
    }
    struct stat st;
    unsigned char rule[RULE_BYTES];
    uint64_t access = plan->write_access;
    if (fstat(dir, &st) != 0) {
        close(dir);
        step = "landlock: fstat of the execution directory";
        goto out;
    }
    if (!S_ISDIR(st.st_mode))
        access &= plan->file_rights;
    memcpy(rule, &access, 8);
    memcpy(rule + 8, &dir, 4);
    long added = syscall(NR_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, rule, 0u);
    int err = errno;
    close(dir);
    errno = err;
    if (added != 0) {
        step = "landlock add_rule (the execution directory)";
        goto out;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        step = "prctl(no_new_privs)";
        goto out;
    }
    if (syscall(NR_LANDLOCK_RESTRICT_SELF, ruleset, 0u) != 0)
        step = "landlock restrict_self";
out:;
    int saved = errno;
    if (ruleset >= 0)
        close(ruleset);
    for (uint32_t i = 0; i < plan->n_rules; i++)
        close(rule_fd(plan, i));
    errno = saved;
    return step;
}

/* seccomp.install_encoded(PreparedFilter.render(getpid())). */
static int seccomp(const plan_t *plan) {
    size_t bytes = (size_t)plan->n_instructions * sizeof(struct sock_filter);
    struct sock_filter *program = malloc(bytes ? bytes : 1);
    if (program == NULL)
        return -1;
    memcpy(program, plan->program, bytes);
    uint32_t pid = (uint32_t)getpid();
    for (uint32_t i = 0; i < plan->n_own; i++)
        program[u32_at(plan->own + 4u * i)].k = pid;
    for (uint32_t i = 0; i < plan->n_group; i++)
        program[u32_at(plan->group + 4u * i)].k = (uint32_t)(0u - pid);
    struct sock_fprog fprog = {.len = (unsigned short)plan->n_instructions, .filter = program};
    int result = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (result == 0)
        result = prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0);
    int err = errno;
    free(program);
    errno = err;
    return result;
}

static PyObject *settle(PyObject *module, PyObject *args) {
    (void)module;
    Py_buffer plan_buffer;
    PyObject *cwd_object = NULL;
    int zygote, go_fd, stdout_fd, stderr_fd, ack_fd, drop, uid, gid, dumpable;
    if (!PyArg_ParseTuple(args, "y*O&iiiiiCiip:settle", &plan_buffer, PyUnicode_FSConverter, &cwd_object, &zygote, &go_fd,
                          &stdout_fd, &stderr_fd, &ack_fd, &drop, &uid, &gid, &dumpable))
        return NULL;
    PyObject *result = NULL;
    plan_t plan;
    if (parse_plan(plan_buffer.buf, plan_buffer.len, &plan) != 0)
        goto done;
    if (drop != 'n' && drop != 'u' && drop != 'c') {
        PyErr_Format(PyExc_ValueError, "settle: drop must be 'none', 'uid' or 'caps' (as 'n', 'u', 'c'), not %c", drop);
        goto done;
    }
    const char *cwd = PyBytes_AS_STRING(cwd_object);

    if (setsid() < 0) {
        fail("setsid");
        goto done;
    }
    if (die_with_parent(zygote) != 0) {
        fail("prctl(PR_SET_PDEATHSIG)");
        goto done;
    }
    int keep[MAX_KEEP];
    size_t n_keep = 0;
    keep[n_keep++] = go_fd;
    keep[n_keep++] = stdout_fd;
    keep[n_keep++] = stderr_fd;
    keep[n_keep++] = ack_fd;
    for (uint32_t i = 0; i < plan.n_rules; i++)
        keep[n_keep++] = rule_fd(&plan, i);
    if (close_other_fds(keep, n_keep) != 0) {
        fail("closing inherited descriptors");
        goto done;
    }
    long baseline = baseline_vm_bytes();
    if (baseline < 0) {
        fail("/proc/self/statm");
        goto done;
    }
    int stdin_fd = memfd_create("stdin", MFD_CLOEXEC); /* before seccomp, which refuses memfds to the code */
    if (stdin_fd < 0) {
        fail("memfd_create(stdin)");
        goto done;
    }
    if (chdir(cwd) != 0) {
        fail("chdir to the execution directory");
        goto done;
    }
    if (yield_to_the_server(&plan) != 0) {
        fail("prctl(PR_SET_DUMPABLE)");
        goto done;
    }
    if (dup2(stdout_fd, 1) < 0 || dup2(stderr_fd, 2) < 0) {
        fail("dup2 of stdout/stderr");
        goto done;
    }
    if (close(stdout_fd) != 0 || close(stderr_fd) != 0) {
        fail("close of the stdio pipes' descriptors");
        goto done;
    }
    if (drop == 'u') {
        if (setgroups(0, NULL) != 0) {
            fail("setgroups");
            goto done;
        }
        if (setgid((gid_t)gid) != 0) {
            fail("setgid");
            goto done;
        }
        if (setuid((uid_t)uid) != 0) {
            fail("setuid");
            goto done;
        }
    } else if (drop == 'c') {
        struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
        struct __user_cap_data_struct data[2];
        memset(data, 0, sizeof data);
        if (syscall(SYS_capset, &header, data) != 0) {
            fail("capset");
            goto done;
        }
    }
    if (die_with_parent(zygote) != 0) { /* new credentials cleared it */
        fail("prctl(PR_SET_PDEATHSIG)");
        goto done;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        fail("prctl(no_new_privs)");
        goto done;
    }
    if (plan.flags & FLAG_LANDLOCK) {
        const char *step = landlock(&plan, cwd);
        if (step != NULL) {
            fail(step);
            goto done;
        }
    }
    if ((plan.flags & FLAG_SECCOMP) && seccomp(&plan) != 0) {
        fail("seccomp filter");
        goto done;
    }
    if (dumpable && prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) {
        fail("prctl(PR_SET_DUMPABLE)");
        goto done;
    }
    result = Py_BuildValue("(li)", baseline, stdin_fd);
done:
    PyBuffer_Release(&plan_buffer);
    Py_XDECREF(cwd_object);
    return result;
}

#define MT_WORDS 624
#define REGION_BYTES 24 /* u64 state address, u64 index address, s64 index value: reseed.py's _REGION */

static PyObject *reseed(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0)
        return NULL;
    PyObject *result = NULL;
    if (view.len % REGION_BYTES != 0) {
        PyErr_SetString(PyExc_ValueError, "reseed: the regions are not (state, index, value) triples");
        goto done;
    }
    for (Py_ssize_t at = 0; at < view.len; at += REGION_BYTES) {
        const unsigned char *region = (const unsigned char *)view.buf + at;
        uint32_t *state = (uint32_t *)(uintptr_t)u64_at(region);
        int32_t index = (int32_t)u64_at(region + 16);
        size_t got = sizeof(uint32_t), want = sizeof(uint32_t) * MT_WORDS; /* words 1..623 */
        while (got < want) {
            ssize_t n = getrandom((char *)state + got, want - got, 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                fail("getrandom");
                goto done;
            }
            got += (size_t)n;
        }
        state[0] = 0x80000000u; /* as both seedings leave it: never the all-zero state */
        memcpy((void *)(uintptr_t)u64_at(region + 8), &index, sizeof index);
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"settle", settle, METH_VARARGS, "Apply an execution's prepared setup (see the module's C source)."},
    {"reseed", reseed, METH_O, "Fresh states for the interpreter's random generators (see the module's C source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_settle", "An execution's setup in one native call (retool/sandbox/_settle.c).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__settle(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "PLAN_VERSION", PLAN_VERSION) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
