"""Launch scripts' words with the variables they set expanded (tuner/launch/shell.py): nothing is run."""

from __future__ import annotations

import pytest

from tuner.launch.shell import expand, shell_variables, shell_words


def test_assignments_expand_in_order_with_defaults_and_integer_arithmetic():
    env = shell_variables(['GPUS=8', 'export NODES=${SLURM_NNODES:-"4"}', "WORLD=$(($GPUS*$NODES))",
                           "HALF=$((WORLD - 2*NODES))", "ARGS=(", "TP=$(cat tp.txt)", "NAME='a b'"])
    assert env == {"GPUS": "8", "NODES": "4", "WORLD": "32", "HALF": "24", "NAME": "a b"}


@pytest.mark.parametrize(("word", "out"), [
    ("$GPUS", "8"), ("${GPUS}", "8"), ("${UNSET:-3}", "3"), ("${UNSET-3}", "3"), ("$UNSET", "$UNSET"),
    ("--x=$GPUS", "--x=8"), ("$((GPUS*3))", "24"), ("$((GPUS/2))", "$((GPUS/2))"), ("$((GPUS**2))", "$((GPUS**2))"),
    ("$((__import__('os')))", "$((__import__('os')))"),
])
def test_expand_replaces_what_is_set_and_keeps_the_rest(word, out):
    assert expand(word, {"GPUS": "8"}) == out


def test_script_words_include_array_contents_and_skip_comments():
    script = "N=2\nARGS=(\n  --a $N  # two\n  --b ${N}\n)\ncmd ${ARGS[@]} \\\n  --c $(( N * 3 ))\n"
    words = shell_words(script)
    assert words[words.index("--a") + 1] == "2" and words[words.index("--c") + 1] == "6"
    assert "two" not in words
    with pytest.raises(ValueError):
        shell_words("cmd 'unbalanced")


def test_array_elements_holding_a_flag_and_its_value_split_as_an_unquoted_expansion_does():
    script = ('V=128256\nARGS=(\n  "--fp8-format hybrid"\n  "--vocab-size $V"\n  "--split \'99,1,0\'"\n'
              '  "--data-path=a b"\n  --mock-data\n)\ntorchrun pretrain_gpt.py ${ARGS[@]} --name "two words"\n')
    words = shell_words(script)
    assert words[words.index("--fp8-format") + 1] == "hybrid"
    assert words[words.index("--vocab-size") + 1] == "128256"
    assert words[words.index("--split") + 1] == "99,1,0"
    assert "--data-path=a b" in words and "two words" in words and "--mock-data" in words


def test_arrays_written_on_one_line_give_their_first_and_last_words():
    words = shell_words("A=(--a 1 --b)\nB+=(--c 2)\nC=(\n --d 3 )\ncmd ${A[@]} ${B[@]} ${C[@]} $((2*3)) $(echo x)\n")
    assert words[words.index("--a") + 1] == "1" and "--b" in words and words[words.index("--c") + 1] == "2"
    assert words[words.index("--d") + 1] == "3" and "6" in words and "$(echo" in words


def test_if_blocks_keep_the_branch_the_scripts_own_variables_choose():
    script = """MODEL_SIZE=7B
if [ ${MODEL_SIZE} == "1B" ]; then
    TP=1
elif [[ "$MODEL_SIZE" == "7B" ]]; then
    TP=2
    if [ "$EXTRA" = "yes" ]; then
        EXTRA_ARGS="--a"
    else
        EXTRA_ARGS="--b"
    fi
else
    TP=8
fi
if [ ! -f run.py ]; then echo missing; fi
if [ -z "$X" ]
then
    Y=1
fi
cmd --tp $TP $EXTRA_ARGS --y $Y
"""
    words = shell_words(script)
    assert words[words.index("--tp") + 1] == "2"
    assert "EXTRA_ARGS=--a" in words and "--b" in words  # $EXTRA is not set: both branches, the last one's value
    assert words[words.index("--y") + 1] == "1"
    assert "8" not in words and "1B" not in words
