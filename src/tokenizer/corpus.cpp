// Written for strata. Varied on purpose (prose and dialogue, several programming languages,
// numbers and dates, Chinese, Japanese, Korean, Russian, accented Latin scripts, emoji) so the
// learned merges cover spaces, indentation, digits, punctuation and multi-byte characters.
#include "tokenizer/corpus.h"

namespace strata::tokenizer {

const char* training_text() {
  return R"corpus(The morning train to the coast was late again, and nobody on the platform seemed surprised.
A woman in a green coat was reading the same page of her book for the third time. Two students
argued about whether the station clock was fast or the timetable was wrong. When the train finally
arrived, the conductor apologised in a voice that suggested he had apologised many times before.

"Is this the one that stops at every village?" asked the old man with the bicycle.
"Every single one," said the conductor. "But the view is better than the express."
"Then I am in no hurry at all," the man replied, and he lifted the bicycle into the carriage.

The history of the region is written in its stones. The harbour was built in the sixteenth century,
rebuilt after the storm of 1703, and extended again when the railway reached the town in 1861. Most
of the fishing boats are gone now; the warehouses have become galleries, cafes and small offices
where people write software for companies on the other side of the world. Still, every evening the
light changes over the water in the same way, and the gulls still think that everything belongs to them.

Scientists measure what they can, and they are careful about what they cannot. A model is useful when
its predictions are tested against the world, not when it merely agrees with itself. The important
thing is to keep asking questions: what happens if the temperature doubles, if the input is empty,
if the user types something nobody expected? Good engineering is mostly the patient handling of
unexpected cases.

def tokenize(text: str, merges: dict[tuple[str, str], int]) -> list[str]:
    """Split text into symbols and apply the lowest-ranked merge until none applies."""
    symbols = list(text)
    while len(symbols) > 1:
        pairs = [(merges.get((a, b), 1 << 30), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
        rank, index = min(pairs)
        if rank == 1 << 30:
            break
        symbols[index:index + 2] = [symbols[index] + symbols[index + 1]]
    return symbols


for step in range(10):
    if step % 3 == 0:
        print(f"step {step}: loss={0.5 / (step + 1):.4f}")

#include <cstdint>
#include <string>
#include <vector>

// Returns the sum of the values, or zero for an empty vector.
template <typename T>
T sum(const std::vector<T>& values) {
  T total{};
  for (const T& value : values) total += value;
  return total;
}

int main(int argc, char** argv) {
  std::vector<int64_t> counts = {3, 1, 4, 1, 5, 9, 2, 6};
  if (argc > 1 && std::string(argv[1]) == "--help") return 0;
  return static_cast<int>(sum(counts) % 256);
}

{"model": "example", "messages": [{"role": "user", "content": "What is the capital of France?"}],
 "temperature": 0.7, "max_tokens": 512, "stream": true, "stop": ["\n\n", "</answer>"]}

SELECT name, COUNT(*) AS orders FROM customers JOIN orders ON orders.customer_id = customers.id
WHERE orders.created_at >= '2024-01-01' GROUP BY name ORDER BY orders DESC LIMIT 10;

const result = await fetch(`/api/v1/items?page=${page}&limit=50`).then((response) => response.json());
if (!result.ok) { throw new Error(`request failed: ${result.status}`); }

$ git commit -m "Fix off-by-one in the ring buffer" && git push origin main
$ ls -la /var/log | grep -i error | wc -l

Invoice 2024-0917: 3 x 12.50 EUR = 37.50 EUR; VAT 19% = 7.13 EUR; total 44.63 EUR.
Phone +1 (555) 010-2345, ext. 67. Coordinates 48.8566 N, 2.3522 E. Version 3.14.159, build 2718.
Temperatures: -4.5, 0, 12.25, 37.8, 100; ratios 1:2, 3/4, 99.9%; 1e-6, 6.02e23, 0x7fff, 0b1011.
2025-03-14T15:09:26Z, 08:30-17:45, 1,000,000 and 1.000.000 and 1 000 000.

今天早上下了一场小雨，空气变得很清新。我们在公园里散步，看到很多人在打太极拳。
机器学习模型需要大量的数据来训练，但是数据的质量比数量更重要。
这个程序的运行速度很快，但是内存占用有点高，我们需要优化一下。
人工智能正在改变我们的工作和生活方式。

東京の春は桜がとても綺麗です。週末には公園でお花見をする人がたくさんいます。
このプログラムは、テキストをトークンに分割してから、モデルに入力します。

오늘은 날씨가 정말 좋네요. 친구들과 함께 한강 공원에 가서 자전거를 탔어요.
이 모델은 한국어와 영어를 모두 이해할 수 있습니다.

Москва — столица России. Сегодня в городе тепло и солнечно, температура около двадцати градусов.

Die Straßenbahn fährt über die Brücke, während die Möwen über dem Fluss kreisen.
Le café était déjà plein quand nous sommes arrivés, mais le serveur nous a trouvé une table près de la fenêtre.
¿Dónde está la estación? Está a dos calles de aquí, al lado de la panadería.
São Paulo é uma cidade enorme, com milhões de habitantes e uma vida cultural intensa.

Great news 🎉🎉 the build is green ✅ and the tests pass 🚀! Coffee ☕ first, then code 💻.
I love this 😂😂😂 so much ❤️ — see you tomorrow 👋🙂 (the weather looks 🌧️ though).
)corpus";
}

}  // namespace strata::tokenizer
