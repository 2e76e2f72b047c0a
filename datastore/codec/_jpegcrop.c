/* dstore.codec._jpegcrop: decode only a region of a JPEG with the system's libjpeg(-turbo), GIL released.
 *
 * libjpeg-turbo's own partial decode (libjpeg API, since 1.5): jpeg_crop_scanline narrows each
 * output row to the iMCU columns that cover the region, jpeg_skip_scanlines passes the rows above
 * it without the inverse DCT, colour conversion or upsampling. simplejpeg does not expose it, and
 * PyTurboJPEG needs libjpeg-turbo 3.0 (Debian 12 has 2.1.5) and offers no region decode either; so
 * this small extension.
 *
 * Exact: the region's pixels are the whole decode's (same libjpeg, same settings: fancy upsampling,
 * the integer IDCT) for every chroma subsampling. jpeg_crop_scanline alone is not: the fancy
 * upsampler of horizontally subsampled chroma (4:2:0, 4:2:2) blends each chroma sample with its
 * neighbour, and at the edges of a cropped row it has none, so it repeats the edge one (up to
 * 25 levels off in a crop's first and last columns on photos). So the crop asked of libjpeg is
 * EDGE_PAD chroma samples wider on each side than the region (inside the image), and the region
 * is cut out of it. The rows need nothing: jpeg_skip_scanlines keeps the upsampler's context rows.
 * tests/test_partial_decode.py compares every subsampling, progressive and restart-marker files.
 *
 * Checked to the end: the rows below the region are still entropy-decoded (jpeg_skip_scanlines
 * runs the Huffman decoder over the iMCU rows it skips, without the inverse DCT, the upsampling or
 * the colour conversion), the last row decoded, and jpeg_finish_decompress reads on to the EOI
 * marker; libjpeg's warnings are errors. So a file damaged anywhere that the whole decode refuses
 * is refused here too, not only in the rows the region reads (libjpeg-turbo's jpeg_skip_scanlines
 * to the last row would mark the end reached without reading it: the last row is read instead).
 *
 * decode_region(data, out, top, left, height, width, denom, gray) -> (out_width, x_offset)
 *   data: the JPEG's bytes (any buffer); out: a writable buffer of at least
 *   height * (width + 64) * channels bytes; the region in the pixels of the decode at 1/denom
 *   (denom 1, 2, 4 or 8); gray: 1 for one channel, 0 for RGB. Writes `height` rows of
 *   out_width pixels (contiguous), whose first column is column x_offset of the scaled image
 *   (x_offset <= left, x_offset + out_width >= left + width: the iMCU columns around the region).
 * Raises ValueError with libjpeg's message on a broken or unsupported JPEG, a warning included
 * (corrupt data anywhere in the file).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <jpeglib.h>

/* Chroma samples of context kept on each side of the region: libjpeg-turbo's fancy upsamplers
 * (h2v1, h2v2) read one neighbour; 2 leaves a margin. In output pixels: EDGE_PAD * max_h_samp_factor. */
#define EDGE_PAD 2

struct error_mgr {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

static void on_error(j_common_ptr cinfo) {
    struct error_mgr *err = (struct error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

/* A warning (corrupt data, a premature end: libjpeg would fill in grey and go on) is an error, as
 * simplejpeg's default (strict) makes it: a broken sample is refused, never served. Trace
 * messages (level > 0) are dropped. */
static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0)
        on_error(cinfo);
}

/* The decode, without the GIL; 0 on success, else 1 with err->message set. */
static int decode(const unsigned char *data, size_t size, unsigned char *out, size_t capacity, int top, int left,
                  int height, int width, int denom, int gray, struct error_mgr *err, int *out_width, int *x_offset) {
    struct jpeg_decompress_struct cinfo;
    cinfo.err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    jpeg_create_decompress(&cinfo);
    if (setjmp(err->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)denom;
    jpeg_start_decompress(&cinfo);
    int channels = gray ? 1 : 3;
    if (top < 0 || left < 0 || height < 1 || width < 1 || (JDIMENSION)(top + height) > cinfo.output_height ||
        (JDIMENSION)(left + width) > cinfo.output_width) {
        snprintf(err->message, sizeof err->message, "region (%d, %d, %d, %d) outside the %ux%u image at 1/%d",
                 top, left, height, width, cinfo.output_height, cinfo.output_width, denom);
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    /* The crop asked of libjpeg: the region and EDGE_PAD chroma samples on each side (see the top). */
    JDIMENSION pad = (JDIMENSION)(EDGE_PAD * cinfo.max_h_samp_factor);
    JDIMENSION x = (JDIMENSION)left > pad ? (JDIMENSION)left - pad : 0;
    JDIMENSION end = (JDIMENSION)(left + width) + pad;
    if (end > cinfo.output_width)
        end = cinfo.output_width;
    JDIMENSION w = end - x;
    if (w < cinfo.output_width)
        jpeg_crop_scanline(&cinfo, &x, &w);
    else
        x = 0;
    if ((size_t)height * w * channels > capacity) {
        snprintf(err->message, sizeof err->message, "output buffer of %zu bytes, %zu needed", capacity,
                 (size_t)height * w * channels);
        jpeg_destroy_decompress(&cinfo);
        return 1;
    }
    if (top > 0)
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)top);
    for (int r = 0; r < height; r++) {
        JSAMPROW row = out + (size_t)r * w * channels;
        jpeg_read_scanlines(&cinfo, &row, 1);
    }
    /* The rest of the file, checked (see the top): entropy-decoded to the last row, which is read
     * (into libjpeg's own memory, freed with cinfo), then on to EOI. */
    if (cinfo.output_scanline < cinfo.output_height) {
        JDIMENSION rest = cinfo.output_height - cinfo.output_scanline;
        if (rest > 1)
            jpeg_skip_scanlines(&cinfo, rest - 1);
        JSAMPARRAY last = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE, w * channels, 1);
        jpeg_read_scanlines(&cinfo, last, 1);
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    *out_width = (int)w;
    *x_offset = (int)x;
    return 0;
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, out;
    int top, left, height, width, denom, gray;
    if (!PyArg_ParseTuple(args, "y*w*iiiiii", &data, &out, &top, &left, &height, &width, &denom, &gray))
        return NULL;
    if (denom != 1 && denom != 2 && denom != 4 && denom != 8) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        return PyErr_Format(PyExc_ValueError, "denom=%d must be 1, 2, 4 or 8", denom);
    }
    struct error_mgr err;
    int failed, out_width = 0, x_offset = 0;
    Py_BEGIN_ALLOW_THREADS
    failed = decode((const unsigned char *)data.buf, (size_t)data.len, (unsigned char *)out.buf, (size_t)out.len, top,
                    left, height, width, denom, gray, &err, &out_width, &x_offset);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (failed)
        return PyErr_Format(PyExc_ValueError, "%s", err.message);
    return Py_BuildValue("(ii)", out_width, x_offset);
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS, "Decodes a region of a JPEG into a buffer (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegcrop", "libjpeg partial decode", -1, methods};

/* VERSION: what dstore.codec.decode checks before it uses a build (an older one, left by an install
 * that did not rebuild the extension, is not used): 2 = exact at the edges of subsampled chroma,
 * 3 = the file checked to its end. */
PyMODINIT_FUNC PyInit__jpegcrop(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", 3) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
