"""The reward's case table: (id, response text, ground truth, expected correctness).

Shared by the tests and by bench/bench_reward.py. Each category of the issue has its own block;
the ids read as sentences in pytest's output.
"""

from __future__ import annotations

from typing import NamedTuple


class Case(NamedTuple):
    id: str
    response: str
    truth: str
    correct: bool


B = "\\boxed"

EXTRACTION = [
    Case("last boxed wins over an earlier one", f"first {B}{{3}} then {B}{{5}}", "5", True),
    Case("earlier boxed is not the answer", f"first {B}{{3}} then {B}{{5}}", "3", False),
    Case("nested braces inside boxed", f"{B}{{\\frac{{1}}{{2}}}}", "0.5", True),
    Case("deeply nested braces", f"{B}{{\\frac{{\\sqrt{{{{3}}}}}}{{2}}}}", "\\frac{\\sqrt{3}}{2}", True),
    Case("escaped braces inside a set", f"{B}{{\\{{1,2\\}}}}", "\\{1,2\\}", True),
    Case("boxed with a space and a bare token", f"so {B} 5$ done", "5", True),
    Case("boxed bare token ends at a period", f"hence {B} 42.", "42", True),
    Case("fbox is a box", "\\fbox{17}", "17", True),
    Case("boxed with space before the brace", f"{B} {{12}}", "12", True),
    Case("unclosed last boxed falls back to the previous box", f"{B}{{7}} and then {B}{{8", "7", True),
    Case("empty last boxed falls back to the previous box", f"{B}{{7}} and then {B}{{}}", "7", True),
    Case("boxed inside display math", f"$$ {B}{{ 25 }} $$", "25", True),
    Case("answer line when there is no box", "reasoning...\nAnswer: 34", "34", True),
    Case("answer line with dollars and a period", "Answer: $34$.", "34", True),
    Case("bold markdown answer line", "**Final Answer:** 117", "117", True),
    Case("answer line, last one wins", "Answer: 3\nwait, no.\nAnswer: 4", "4", True),
    Case("lowercase answer line", "the final answer: 9", "9", True),
    Case("full-width colon answer line", "Answer\uff1a 12", "12", True),
    Case("answer tags of the ReTool SFT format", "<answer>\n\\boxed{210}\n</answer>", "210", True),
    Case("answer tags without a box", "<answer> 210 </answer>", "210", True),
    Case("boxed beats an answer line", f"Answer: 3\n{B}{{4}}", "4", True),
    Case("no answer at all is wrong", "I am not sure what the answer is.", "5", False),
    Case("a bare number in prose is not an answer", "The result is 5", "5", False),
    Case("empty response is wrong", "", "5", False),
]

TOOL_OUTPUT = [
    Case("boxed inside interpreter output is ignored", f"<interpreter>{B}{{9}}</interpreter> so I get {B}{{8}}", "9", False),
    Case("model answer after interpreter output counts", f"<interpreter>{B}{{9}}</interpreter> so I get {B}{{8}}", "8", True),
    Case("only interpreter has a box: no answer", f"<code>print(1)</code><interpreter>{B}{{9}}</interpreter> hmm", "9", False),
    Case("boxed printed by code is not the answer", f'<code>\n```python\nprint("{B}{{6}}")\n```\n</code>', "6", False),
    Case("tool_response block is ignored", "<tool_response>\nAnswer: 6\n</tool_response>\nDone.", "6", False),
    Case(
        "verl decoded tool turn then the real answer",
        f'<tool_call>\n{{"name": "code_interpreter"}}\n</tool_call>user\n<tool_response>\n{B}{{1}}\n</tool_response>\nassistant\nSo {B}{{2}}',
        "2",
        True,
    ),
    Case("unclosed tool output at the end is ignored", f"{B}{{3}} then <interpreter>{B}{{4}}", "3", True),
    Case("output fence is ignored", f"```output\n{B}{{5}}\n```\nThus {B}{{6}}", "6", True),
    Case("python fence with boxed string is ignored", f"```python\nx = '{B}{{5}}'\n```\nAnswer: 7", "7", True),
    Case("answer line inside interpreter is ignored", "<interpreter>\nAnswer: 11\n</interpreter>\nAnswer: 12", "11", False),
]

NORMALISATION = [
    Case("whitespace inside the box", f"{B}{{ 1 2 }}", "12", True),
    Case("dollar signs inside the box", f"{B}{{$15$}}", "15", True),
    Case("text unit after a number", f"{B}{{15\\text{{ cm}}}}", "15", True),
    Case("text unit with a power", f"{B}{{15\\text{{ cm}}^2}}", "15", True),
    Case("compound text unit", f"{B}{{3\\text{{ m}}/\\text{{s}}}}", "3", True),
    Case("mathrm unit", f"{B}{{20\\,\\mathrm{{kg}}}}", "20", True),
    Case("plain word unit", f"{B}{{12 inches}}", "12", True),
    Case("text answer unwrapped", f"{B}{{\\text{{Monday}}}}", "Monday", True),
    Case("degrees with circ", f"{B}{{90^\\circ}}", "90", True),
    Case("degrees with braced circ", f"{B}{{90^{{\\circ}}}}", "90", True),
    Case("unicode degree sign", f"{B}{{45°}}", "45", True),
    Case("degrees as a word", f"{B}{{30 degrees}}", "30", True),
    Case("thousands separators", f"{B}{{1,000,000}}", "1000000", True),
    Case("latex thousands separator", f"{B}{{12{{,}}345}}", "12345", True),
    Case("thin-space thousands separator", f"{B}{{12\\,345}}", "12345", True),
    Case("leading zeros of an integer", f"{B}{{007}}", "7", True),
    Case("AIME zero-padded truth", f"{B}{{25}}", "025", True),
    Case("dfrac equals frac", f"{B}{{\\dfrac{{3}}{{4}}}}", "\\frac{3}{4}", True),
    Case("tfrac short form", f"{B}{{\\tfrac34}}", "\\frac{3}{4}", True),
    Case("frac without braces", f"{B}{{\\frac 3 4}}", "0.75", True),
    Case("unicode minus", f"{B}{{\u22125}}", "-5", True),
    Case("en dash as minus", f"{B}{{\u20135}}", "-5", True),
    Case("percent sign", f"{B}{{50\\%}}", "50", True),
    Case("escaped dollar currency sign", f"{B}{{\\$5}}", "5", True),
    Case("variable assignment", f"{B}{{x = 14}}", "14", True),
    Case("subscripted assignment", f"{B}{{a_1=3}}", "3", True),
    Case("trailing period in box", f"{B}{{8.}}", "8", True),
    Case("extra braces", f"{B}{{{{{{9}}}}}}", "9", True),
    Case("left right parentheses", f"{B}{{\\left(1, 2\\right)}}", "(1,2)", True),
    Case("displaystyle dropped", f"{B}{{\\displaystyle\\frac{{1}}{{3}}}}", "\\frac13", True),
    Case("inline math delimiters", f"{B}{{\\(6\\)}}", "6", True),
    Case("plus sign", f"{B}{{+6}}", "6", True),
    Case("negative zero", f"{B}{{-0}}", "0", True),
    Case("sqrt without braces", f"{B}{{\\sqrt2}}", "\\sqrt{2}", True),
    Case("unicode pi", f"{B}{{2\u03c0}}", "2\\pi", True),
]

NUMERIC = [
    Case("decimal equals fraction", f"{B}{{0.5}}", "\\frac{1}{2}", True),
    Case("fraction equals decimal", f"{B}{{\\frac{{1}}{{4}}}}", "0.25", True),
    Case("slash fraction", f"{B}{{3/4}}", "\\frac{3}{4}", True),
    Case("trailing decimal zeros", f"{B}{{34.00}}", "34", True),
    Case("negative fraction forms", f"{B}{{\\frac{{-1}}{{2}}}}", "-\\frac{1}{2}", True),
    Case("scientific e notation", f"{B}{{1.5e3}}", "1500", True),
    Case("scientific times ten", f"{B}{{3\\times10^{{4}}}}", "30000", True),
    Case("unreduced fraction", f"{B}{{\\frac{{6}}{{8}}}}", "\\frac34", True),
    Case("rounded decimal within tolerance", f"{B}{{0.3333333333}}", "\\frac{1}{3}", True),
    Case("coarsely rounded decimal is wrong", f"{B}{{0.33}}", "\\frac{1}{3}", False),
    Case("integer off by one", f"{B}{{35}}", "34", False),
    Case("sign error", f"{B}{{-34}}", "34", False),
    Case("fraction vs its inverse", f"{B}{{\\frac{{4}}{{3}}}}", "\\frac{3}{4}", False),
    Case("division by zero is not a number", f"{B}{{1/0}}", "0", False),
    Case("percent of the wrong size", f"{B}{{5\\%}}", "0.5", False),
]

SYMBOLIC = [
    Case("sqrt simplification", f"{B}{{2\\sqrt{{2}}}}", "\\sqrt{8}", True),
    Case("rationalised denominator", f"{B}{{\\frac{{\\sqrt{{2}}}}{{2}}}}", "\\frac{1}{\\sqrt{2}}", True),
    Case("expanded polynomial", f"{B}{{x^2+2x+1}}", "(x+1)^2", True),
    Case("reordered sum", f"{B}{{\\sqrt{{3}}+1}}", "1+\\sqrt{3}", True),
    Case("pi times fraction", f"{B}{{\\frac{{\\pi}}{{2}}}}", "\\frac{1}{2}\\pi", True),
    Case("power of two", f"{B}{{2^{{10}}}}", "1024", True),
    Case("log identity", f"{B}{{\\log_2 8}}", "3", True),
    Case("interval", f"{B}{{[1, 2)}}", "[1,2)", True),
    Case("set order does not matter", f"{B}{{\\{{2, 1\\}}}}", "\\{1, 2\\}", True),
    Case("tuple", f"{B}{{(3, 4)}}", "(3,4)", True),
    Case("decimal approximation of a root", f"{B}{{0.8660254}}", "\\frac{\\sqrt{3}}{2}", True),
    Case("coarse approximation of a root is wrong", f"{B}{{0.87}}", "\\frac{\\sqrt{3}}{2}", False),
    Case("binomial coefficient", f"{B}{{\\binom{{5}}{{2}}}}", "10", True),
    Case("factorial", f"{B}{{5!}}", "120", True),
    Case("different sqrt", f"{B}{{\\sqrt{{3}}}}", "\\sqrt{2}", False),
    Case("different polynomial", f"{B}{{x^2+1}}", "(x+1)^2", False),
    Case("pi vs integer", f"{B}{{\\pi}}", "3", False),
    Case("tuple order matters", f"{B}{{(4, 3)}}", "(3,4)", False),
    Case("symbolic vs wrong number", f"{B}{{2^{{10}}}}", "1000", False),
]

# Answer shapes a held-out judgement set found misjudged (issue 15): each with the wrong verdicts it
# must not open.
ACCURACY = [
    Case("choice letter with its value", f"{B}{{\\textbf{{(C)}}\\ 34}}", "34", True),
    Case("choice letter with a wrong value", f"{B}{{\\textbf{{(C)}}\\ 35}}", "34", False),
    Case("choice letter against the letter", f"{B}{{\\textbf{{(C)}}\\ 34}}", "C", True),
    Case("another choice letter with the same value", f"{B}{{(B)\\ 34}}", "(C) 34", False),
    Case("a choice letter alone does not name a value", f"{B}{{(C)}}", "34", False),
    Case("final plain statement without a box", "So we get 34 apples.\nThe final answer is 34.", "34", True),
    Case("plain statement with a wrong value", "The answer is 35.", "34", False),
    Case("a negated statement is not the answer", "The answer is not 34.", "34", False),
    Case("later corrected final statement overrides the box", f"{B}{{33}}. Wait, I made an arithmetic error.\nThe final answer is 34.", "34", True),
    Case("the box a later statement corrected no longer counts", f"{B}{{33}}. Wait, I made an arithmetic error.\nThe final answer is 34.", "33", False),
    Case("a correction is found after a letter whose lower case is longer", f"\u0130 {B}{{33}}. Oops.\nThe Final answer is 34.", "34", True),
    Case("prose after a box does not override it", f"{B}{{34}}. The final answer is an integer, as expected.", "34", True),
    Case("framebox is a box", "\\framebox{34}", "34", True),
    Case("framebox with a width", "\\framebox[2cm]{34}", "34", True),
    Case("repeating decimal", f"{B}{{0.\\overline{{3}}}}", "\\frac{1}{3}", True),
    Case("repeating decimal after fixed digits", f"{B}{{0.1\\overline{{6}}}}", "\\frac{1}{6}", True),
    Case("repeating decimal is not its truncation", f"{B}{{0.\\overline{{3}}}}", "0.3", False),
    Case("units after pi", f"{B}{{36\\pi \\text{{ cm}}^2}}", "36\\pi", True),
    Case("units after pi keep the pi", f"{B}{{36\\pi \\text{{ cm}}^2}}", "36", False),
    Case("words between numbers are not a unit", f"{B}{{1 \\text{{ or }} 2}}", "12", False),
    Case("varnothing is the empty set", f"{B}{{\\varnothing}}", "\\emptyset", True),
    Case("empty braces are the empty set", f"{B}{{\\{{\\}}}}", "\\varnothing", True),
    Case("the empty set is not a set with zero", f"{B}{{\\varnothing}}", "\\{0\\}", False),
    Case("percent equals the fraction it names", f"{B}{{50\\%}}", "0.5", True),
    Case("fraction against a percent truth", f"{B}{{0.25}}", "25\\%", True),
    Case("pmatrix with spaced row breaks", f"{B}{{\\begin{{pmatrix}} 1 \\\\ 2 \\end{{pmatrix}}}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    Case("bmatrix equals pmatrix", f"{B}{{\\begin{{bmatrix}} 1 & 2 \\\\ 3 & 4 \\end{{bmatrix}}}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", True),
    Case("matrix entries as fraction and decimal", f"{B}{{\\begin{{pmatrix}} \\frac12 \\\\ -2 \\end{{pmatrix}}}}", "\\begin{pmatrix}0.5\\\\-2\\end{pmatrix}", True),
    Case("matrix with a wrong entry", f"{B}{{\\begin{{pmatrix}} 1 \\\\ 3 \\end{{pmatrix}}}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False),
    Case("matrix of another shape", f"{B}{{\\begin{{pmatrix}} 1 & 2 \\end{{pmatrix}}}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", False),
    Case("matrix with a symbolic entry", f"{B}{{\\begin{{pmatrix}} \\sqrt{{8}} \\\\ 1 \\end{{pmatrix}}}}", "\\begin{pmatrix}2\\sqrt{2}\\\\1\\end{pmatrix}", True),
    Case("unicode vulgar fraction", f"{B}{{\u00bd}}", "\\frac{1}{2}", True),
    Case("mixed number with a vulgar fraction", f"{B}{{2\u00bd}}", "\\frac52", True),
    Case("vulgar fraction of another value", f"{B}{{\u2153}}", "0.5", False),
    Case("zero-width space inside a number", f"{B}{{3\u200b4}}", "34", True),
    Case("byte-order mark inside a number", f"{B}{{1\ufeff000}}", "1000", True),
    Case("zero-width joiner does not change the digits", f"{B}{{3\u200d4}}", "35", False),
]

# Correct answers a careful grader credits that the reward scored -1 (issue 29), each shape with
# the wrong answers it must still refuse.
GRADER_SHAPES = [
    # units with a slash
    Case("speed in metres per second", f"{B}{{3 m/s}}", "3", True),
    Case("speed in kilometres per hour", f"{B}{{60 km/h}}", "60", True),
    Case("acceleration with a squared unit", f"{B}{{9.8 m/s^2}}", "9.8", True),
    Case("slash unit inside text", f"{B}{{12\\text{{ km/h}}}}", "12", True),
    Case("slash unit inside mathrm after a space", f"{B}{{5\\ \\mathrm{{m/s}}}}", "5", True),
    Case("slash unit in text with a power", f"{B}{{2.5\\,\\text{{m/s}}^2}}", "2.5", True),
    Case("miles per hour in text", f"{B}{{40 \\text{{ mi/h}}}}", "40", True),
    Case("unit with a negative power", f"{B}{{15\\,\\mathrm{{m}}\\,\\mathrm{{s}}^{{-1}}}}", "15", True),
    Case("a slash unit does not make a wrong speed right", f"{B}{{3 m/s}}", "4", False),
    Case("letters over letters are not a unit", f"{B}{{3 a/b}}", "3", False),
    Case("a slash unit is not a digit", f"{B}{{60 km/h}}", "6", False),
    Case("a fraction is not a unit", f"{B}{{3/4}}", "3", False),
    # "Answer:" in the middle of a line
    Case("answer after a sentence on its line", "We add them up. Answer: 34", "34", True),
    Case("bold answer after a sentence", "So x = 5 and y = 29, hence the sum. **Answer:** 34", "34", True),
    Case("final answer after a semicolon", "Thus we are done; Final Answer: $\\frac{1}{2}$", "0.5", True),
    Case("the last mid-line answer wins", "The key word is Answer: this is a trap... Answer: 12", "12", True),
    Case("mid-line answer ends at its sentence", "Checking the cases. Answer: 34. That was quick.", "34", True),
    Case("a wrong mid-line answer stays wrong", "Checking all cases gives the total. Answer: 35", "34", False),
    Case("a mid-line answer inside interpreter output is ignored", "Done. <interpreter>Answer: 34</interpreter> so", "34", False),
    Case("a word ending in answer is not an answer", "We checked the countanswer: 34 twice", "34", False),
    # a plain final statement after intermediate boxes
    Case("statement after two intermediate boxes", f"First, a = {B}{{12}}. Then b = {B}{{22}}.\nTherefore, the answer is 34.", "34", True),
    Case("statement with a fraction after a box", f"Part one gives {B}{{3}}.\nSo the answer is $\\frac{{3}}{{4}}$.", "0.75", True),
    Case("answer line after intermediate boxes", f"We get {B}{{5}} and {B}{{6}}.\nAnswer: 11", "11", True),
    Case("the intermediate box is not the answer", f"Intermediate: {B}{{3}}.\nSo the answer is 4.", "3", False),
    Case("a wrong statement after a box is wrong", f"We get {B}{{34}}.\nSo the answer is 35.", "34", False),
    Case("prose statement after a box keeps the box", f"{B}{{34}}. The answer is an integer, as it must be.", "34", True),
    # a bare final number
    Case("bare number on the last line", "The sum of the roots is what we need.\n\n34", "34", True),
    Case("bold bare number on the last line", "Adding everything up:\n\n**34**", "34", True),
    Case("display math on the last line", "So the final value is\n$$\\frac{7}{2}$$", "3.5", True),
    Case("inline math on the last line", "Hence\n$x = 17$", "17", True),
    Case("the whole response is a number", "204", "204", True),
    Case("a wrong bare number stays wrong", "Adding everything up:\n\n34\n", "35", False),
    Case("a list marker is not a bare answer", "Step 1. Compute things.\n2.", "2", False),
    Case("a number inside the last sentence is not bare", "We are done and the count is 34 overall", "34", False),
    Case("a bare number printed by the interpreter is not the model's", "Let me compute.\n<interpreter>\n34\n</interpreter>", "34", False),
    # tuples of decimals
    Case("tuple of decimals against fractions", f"{B}{{(0.5, 1.25)}}", "(\\frac12, \\frac54)", True),
    Case("tuple of decimals with trailing zeros", f"{B}{{(1.50, 2.0)}}", "(1.5,2)", True),
    Case("tuple with a rounded third", f"{B}{{(0.333333333, 2)}}", "(\\frac13,2)", True),
    Case("tuple of negative decimals", f"{B}{{(-0.75, 0.125)}}", "(-\\frac34,\\frac18)", True),
    Case("triple of decimals", f"{B}{{(0.1, 0.2, 0.3)}}", "(\\frac1{10},\\frac15,\\frac3{10})", True),
    Case("fractions against a tuple of decimals", f"{B}{{(\\frac12, \\frac54)}}", "(0.5,1.25)", True),
    Case("tuple with a wrong decimal", f"{B}{{(0.5, 1.2)}}", "(\\frac12, \\frac54)", False),
    Case("tuple of decimals in the wrong order", f"{B}{{(1.25, 0.5)}}", "(\\frac12, \\frac54)", False),
    Case("half-open interval is not an open one", f"{B}{{[0.5, 1.5)}}", "(0.5,1.5)", False),
    Case("tuple with a coarsely rounded third", f"{B}{{(0.33, 2)}}", "(\\frac13,2)", False),
    Case("pair is not a triple", f"{B}{{(0.5, 1.5)}}", "(0.5,1.5,2)", False),
    # a trailing parenthetical remark
    Case("remark after an answer line", "Answer: 34 (the number of apples)", "34", True),
    Case("remark inside the box as text", f"{B}{{34 \\text{{ (in cm)}}}}", "34", True),
    Case("remark after a final statement", "The final answer is 17 (after simplifying).", "17", True),
    Case("remark of text in parentheses", f"{B}{{12 (\\text{{dozen eggs}})}}", "12", True),
    Case("one long word is a remark", f"{B}{{3.14 (approximately)}}", "3.14", True),
    Case("a remark does not fix a wrong answer", "Answer: 34 (not 35)", "35", False),
    Case("a product is not a remark", f"{B}{{2(x+1)}}", "2", False),
    Case("short letters in parentheses are a product", f"{B}{{2(ab)}}", "2", False),
]

# Equations of the asked quantity (issue 48): an AIME "find m+n" answer boxed as ``m+n=34`` states the
# value 34 of a named quantity. Every side without an unknown is a value and must equal the truth; a
# side with an unknown names the quantity. So a false equation (``1=34``) or a hedge (``m+n=35=34``)
# is wrong, though math-verify and verl's DAPO reward read only the last side. Decided without sympy.
EQUATIONS = [
    Case("equation of the asked quantity", f"{B}{{m+n=34}}", "34", True),
    Case("equation of the asked quantity with spaces", f"{B}{{m + n = 34}}", "34", True),
    Case("equation of the asked quantity in a final statement", "So the answer is $m+n=34$.", "34", True),
    Case("equation of the asked quantity against an AIME zero-padded truth", f"{B}{{a+b+c = 34}}", "034", True),
    Case("equation with the value on the left", f"{B}{{34=m+n}}", "34", True),
    Case("equation naming a segment", f"{B}{{AB=34}}", "34", True),
    Case("equation with a fraction as its value", f"{B}{{m+n=\\frac{{68}}{{2}}}}", "34", True),
    Case("equation with a unit after its value", f"{B}{{m+n = 34 \\text{{ cm}}}}", "34", True),
    Case("equation chain through a sum", f"{B}{{m+n=13+21=34}}", "34", True),
    Case("equation chain of the asked quantity and its value", f"{B}{{p+q = 34 = 34}}", "34", True),
    Case("equation of a Greek unknown", f"{B}{{\\cos\\theta=\\frac{{\\sqrt{{3}}}}{{2}}}}", "\\frac{\\sqrt{3}}{2}", True),
    Case("equation of the asked quantity with a wrong value", f"{B}{{m+n=35}}", "34", False),
    Case("equation with a wrong value on the left", f"{B}{{35=m+n}}", "34", False),
    Case("a false equation of numbers is not its right side", f"{B}{{1=34}}", "34", False),
    Case("a false equation is not its left side either", f"{B}{{34=1}}", "34", False),
    Case("an equation chain hedging two values", f"{B}{{m+n=35=34}}", "34", False),
    Case("an equation chain with a false middle", f"{B}{{m+n=30+5=34}}", "34", False),
    Case("an equation between unknowns states no value", f"{B}{{m=34n}}", "34", False),
    Case("an equation whose value is another quantity", f"{B}{{\\frac{{m}}{{n}}=\\frac{{3}}{{4}}}}", "7", False),
    Case("an equation with pi on one side is not true", f"{B}{{1=2\\pi}}", "2\\pi", False),
    Case("an assignment against the same assignment", f"{B}{{x=3}}", "x=3", True),
    Case("an assignment of a wrong value", f"{B}{{x=3}}", "34", False),
    Case("assignments in the order of the pair", f"{B}{{a=1, b=2}}", "(1,2)", True),
    Case("assignments of decimals against a pair of fractions", f"{B}{{a=0.5, b=1.25}}", "(\\frac12,\\frac54)", True),
    Case("assignments in the other order are not the pair", f"{B}{{a=2, b=1}}", "(1,2)", False),
    Case("assignments of too few values are not the pair", f"{B}{{a=1}}", "(1,2)", False),
    Case("two assignments of one unknown are not a pair", f"{B}{{a=1, a=2}}", "(1,2)", False),
    Case("assignments joined by and are the pair", f"{B}{{a=1 \\text{{ and }} b=2}}", "(1,2)", True),
    Case("a list of equations is no single value", f"{B}{{x=34; y=35}}", "35", False),
    Case("equations side by side are no single value", f"{B}{{x = 34 \\quad y = 35}}", "35", False),
    Case("a list of equations is no single value even when its last is right", f"{B}{{m=3, n=31, m+n=34}}", "34", False),
]

ADVERSARIAL = [
    Case("power tower of nines", f"{B}{{9^{{9^{{9^9}}}}}}", "5", False),
    Case("power tower of tens", f"{B}{{10^{{10^{{10}}}}}}", "7", False),
    Case("huge literal exponent", f"{B}{{2^{{1000000000}}}}", "2", False),
    Case("huge factorial", f"{B}{{100000!}}", "3", False),
    Case("very long digit string", f"{B}{{{'9' * 5000}}}", "9", False),
    Case("deep nesting of braces", f"{B}{{{'{' * 500}1{'}' * 500}}}", "1", True),
    Case("unbalanced braces", f"{B}{{{'{' * 500}1", "1", False),
    Case("thousands of boxes", f"{B}{{1}} " * 2000 + f"{B}{{2}}", "2", True),
    Case("long junk answer", f"{B}{{{'x+' * 2000}x}}", "1", False),
    Case("latex garbage", f"{B}{{\\frac{{\\frac{{}}{{}}}}{{\\sqrt[}}}}", "1", False),
    Case("many unclosed tool tags", "<interpreter>" * 2000 + f"{B}{{1}}", "1", False),
    Case("answer line built to backtrack", "Answer: a" + " *" * 20000 + "b", "1", False),
    Case("thousands of unclosed boxes", f"{B}{{" * 20000, "1", False),
    Case("thousands of unclosed text commands", B + "{" + "\\text{" * 5000 + "}", "1", False),
    Case("huge answer is only compared verbatim", f"{B}{{{'1' * 2 + ' ' * 50000 + '2'}}}", "1", False),
    Case("nul and control characters are ignored", f"{B}{{\x00 3 \x07}}", "3", True),
    Case("thousands of unclosed answer tags", "<answer>" * 20000 + "5", "5", False),
    Case("unclosed answer tags in long prose", ("<answer> we reason about the sum. " * 12000) + "</answer>", "5", False),
    Case("thousands of answer statements", "the answer is 1. " * 20000 + "The final answer is 2.", "2", True),
    Case("a statement built to backtrack", "the answer is" + " " * 50000 + "x", "1", False),
    Case("zero-width characters everywhere", "\u200b".join(f"{B}{{12}}"), "12", True),
    Case("a megabyte of tool output before the answer", "<interpreter>" + "9" * 1_200_000 + f"</interpreter> so {B}{{7}}", "7", True),
]

WRONG = [
    Case("wrong integer", f"{B}{{123}}", "124", False),
    Case("wrong text answer", f"{B}{{\\text{{Tuesday}}}}", "Monday", False),
    Case("answer with extra term", f"{B}{{34 + x}}", "34", False),
    Case("two answers in one box", f"{B}{{3, 4}}", "3", False),
    Case("truth is only a substring", f"{B}{{341}}", "34", False),
    Case("wrong answer line", "Answer: 10", "100", False),
    Case("zero vs empty", f"{B}{{0}}", "", False),
]

ALL = EXTRACTION + TOOL_OUTPUT + NORMALISATION + NUMERIC + SYMBOLIC + ACCURACY + GRADER_SHAPES + ADVERSARIAL + WRONG
# ALL is also the set the second verifier's benign disagreement rate is measured on
# (tests/dynamics/test_second_verifier.py, the figure in docs/recipe.md); EQUATIONS joins it when that
# figure is measured again (math-verify misjudges seven of them: it reads only an equation's last side).
TABLE = ALL + EQUATIONS
"""Every case the reward is tested and benchmarked on."""
