/* See fakestate.h. */
#define _DEFAULT_SOURCE
#include "fakestate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

static int read_all(int fd, void *buf, size_t size) {
    size_t done = 0;
    while (done < size) {
        ssize_t n = pread(fd, (char *)buf + done, size - done, (off_t)done);
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t size) {
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd, (const char *)buf + done, size - done, (off_t)done);
        if (n <= 0) return -1;
        done += (size_t)n;
    }
    return 0;
}

static void count_call(fake_header *h, const char *fn) {
    for (int i = 0; i < FAKE_MAX_COUNTERS; i++) {
        fake_counter *c = &h->calls[i];
        if (c->fn[0] == '\0') snprintf(c->fn, sizeof c->fn, "%s", fn);
        if (strcmp(c->fn, fn) == 0) {
            c->count++;
            return;
        }
    }
}

static int injected(fake_header *h, const char *fn) {
    for (int i = 0; i < FAKE_MAX_RULES; i++) {
        fake_rule *r = &h->rules[i];
        if (r->times == 0 || (strcmp(r->fn, fn) != 0 && strcmp(r->fn, "*") != 0)) continue;
        if (r->skip > 0) {
            r->skip--;
            continue;
        }
        if (r->times > 0) r->times--;
        return r->code;
    }
    return 0;
}

static int open_locked(fake_session *s, const char *path, size_t size, uint32_t magic) {
    s->fd = -1;
    s->state = NULL;
    s->size = size;
    if (path == NULL || path[0] == '\0') return -1;
    s->fd = open(path, O_RDWR | O_CLOEXEC);
    if (s->fd < 0) return -1;
    s->state = calloc(1, size);
    if (s->state == NULL || flock(s->fd, LOCK_EX) != 0 || read_all(s->fd, s->state, size) != 0 ||
        s->state->magic != magic || s->state->size != size) {
        fake_end(s, 0);
        return -1;
    }
    return 0;
}

int fake_begin(fake_session *s, const char *path, size_t size, uint32_t magic, const char *fn) {
    if (open_locked(s, path, size, magic) != 0) return -1;
    count_call(s->state, fn);
    return injected(s->state, fn);
}

void fake_end(fake_session *s, int dirty) {
    if (s->fd >= 0) {
        if (dirty && s->state != NULL) write_all(s->fd, s->state, s->size);
        flock(s->fd, LOCK_UN);
        close(s->fd);
    }
    free(s->state);
    s->fd = -1;
    s->state = NULL;
}

void fake_complain(fake_header *h, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(h->last_complaint, sizeof h->last_complaint, fmt, args);
    va_end(args);
    h->complaints++;
}

int fake_readable(const void *p, size_t n) {
    /* write(2) reads the buffer in the kernel and answers EFAULT where it is not mapped. */
    int fds[2];
    if ((uintptr_t)p < 4096 || pipe(fds) != 0) return 0;
    ssize_t w = write(fds[1], p, n);
    int ok = w == (ssize_t)n;
    close(fds[0]);
    close(fds[1]);
    return ok;
}

int fake_create(const char *path, size_t size, uint32_t magic, const void *initial) {
    fake_header *h = calloc(1, size);
    if (h == NULL) return -1;
    if (initial != NULL) memcpy(h, initial, size);
    h->magic = magic;
    h->size = (uint32_t)size;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    int rc = -1;
    if (fd >= 0 && flock(fd, LOCK_EX) == 0 && ftruncate(fd, 0) == 0) rc = write_all(fd, h, size);
    if (fd >= 0) close(fd);
    free(h);
    return rc;
}

static int control(fake_session *s, const char *path) {
    /* The header alone: the control calls work on any fake's state file. */
    fake_header probe;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read_all(fd, &probe, sizeof probe) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    close(fd);
    return open_locked(s, path, probe.size, probe.magic);
}

int fake_fail(const char *path, const char *fn, int code, int times, int skip) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    for (int i = 0; i < FAKE_MAX_RULES; i++) {
        fake_rule *r = &s.state->rules[i];
        if (r->times != 0 && strcmp(r->fn, fn) != 0) continue;
        snprintf(r->fn, sizeof r->fn, "%s", fn);
        r->code = code;
        r->times = times;
        r->skip = skip;
        fake_end(&s, 1);
        return 0;
    }
    fake_end(&s, 0);
    return -1;
}

int fake_calls(const char *path, const char *fn) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    int count = 0, all = strcmp(fn, "*") == 0; /* "*": every vendor call, controls not counted */
    for (int i = 0; i < FAKE_MAX_COUNTERS; i++) {
        const char *name = s.state->calls[i].fn;
        if (all ? name[0] != '\0' && strcmp(name, "control") != 0 : strcmp(name, fn) == 0)
            count += (int)s.state->calls[i].count;
    }
    fake_end(&s, 0);
    return count;
}

int fake_complaints(const char *path, char *buf, size_t len) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    int count = (int)s.state->complaints;
    if (buf != NULL && len > 0) snprintf(buf, len, "%s", s.state->last_complaint);
    fake_end(&s, 0);
    return count;
}

int fake_clear(const char *path) {
    fake_session s;
    if (control(&s, path) != 0) return -1;
    memset(s.state->rules, 0, sizeof s.state->rules);
    fake_end(&s, 1);
    return 0;
}
